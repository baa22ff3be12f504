"""`mode="reduce-overhead"` (option `triton.cudagraphs`): a compiled CUDA graph replayed as one CUDA graph.

`CudaGraphRunner` wraps a compiled graph's flat function (inputs -> outputs; mutated inputs come
back as outputs and the aot runner writes them back, outside the CUDA graph):
- one recording per *input signature* (every tensor input's shape, strides, dtype and device, and
  every non-tensor input's value): a call with another signature (another size under dynamic
  shapes) never replays a graph recorded for other memory, it records its own;
- the first call of a signature runs the function as it is (a warm-up: Triton compiles its kernels,
  libraries make their handles); the second records; later ones replay;
- inputs are copied into the recording's static buffers before each replay, except *static* inputs
  (module parameters: those given, and every nn.Parameter of the recorded call), which the graph
  reads in place: when one of those is in other memory than at recording (a new tensor), the
  signature is recorded again;
- outputs are copies of the static output buffers, so a later replay never changes a result the
  caller holds; an output that is a static input itself (a training forward returns the weights it
  saves for the backward) is that input, so the backward's recording finds it in place;
- all recordings share one private memory pool.
A guard failure in capture picks another compiled entry, with its own runner: a graph is never
replayed for inputs its guards did not pass.

What it cannot record runs without it (`blocker` names why): tensors on another device than CUDA, random
ops (the generator's state would be baked in), index checks (the wrapper reads an error flag back
from the device after the kernel, a synchronization a recording cannot hold).
The CUDA calls go through `GraphApi`, so the rules above are tested without a GPU.
"""
import dataclasses

import torch
import torch.utils._pytree as pytree

from kiln.compiler import ir
from kiln.debug.logs import log


class GraphApi:
    """The CUDA graph calls the runner makes: torch.cuda's public CUDAGraph API."""

    def new_pool(self):
        return torch.cuda.graph_pool_handle()

    def record(self, fn, static_inputs, pool):
        """(replay: () -> None, static outputs): `fn` recorded on `static_inputs`."""
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, pool=pool):
            outputs = fn(*static_inputs)
        return graph.replay, outputs


@dataclasses.dataclass
class Recording:
    replay: object
    static_inputs: list   # per input: the tensor the graph reads (a static buffer or the static input itself)
    outputs: tuple
    read_in_place: frozenset  # the positions of static inputs
    passed_through: dict      # output position -> the position of the static input it is


def blocker(program, compiled=()):
    """Why a compiled program (`compiled`: its backends' CompiledKernels) cannot be recorded as a
    CUDA graph, or None."""
    if any(getattr(entry, "checks", None) for c in compiled for entry in c.entries):
        return "its kernels check indices read from tensors (the wrapper reads the result back)"
    for step in program.steps:
        if isinstance(step, ir.ExternCall) and isinstance(step.target, torch._ops.OpOverload) and \
                torch.Tag.nondeterministic_seeded in step.target.tags:
            return f"random op {step.target}"
    for name, buf in program.buffers.items():
        if buf.layout.device.type != "cuda" and not (isinstance(buf, ir.ExternBuffer) and buf.call.outputs is None):
            return f"buffer {name} is on {buf.layout.device}"
    return None


def signature(args):
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a)
                 for a in args)


class CudaGraphRunner:
    def __init__(self, fn, static_positions=(), api=None):
        self.fn = fn
        self.static_positions = frozenset(static_positions)  # inputs read in place (module tensors)
        self.api = api or GraphApi()
        self.pool = None
        self.warmed_up = set()     # signatures run once
        self.recordings = {}       # signature -> Recording
        self.failed = set()        # signatures whose recording raised: they run without graphs
        for name in dir(fn):
            if name.startswith("kiln_"):
                setattr(self, name, getattr(fn, name))

    def __call__(self, *args):
        key = signature(args)
        if key in self.failed:
            return self.fn(*args)
        recording = self.recordings.get(key)
        if recording is not None and not self.static_inputs_moved(recording, args):
            return self.replay(recording, args)
        if key not in self.warmed_up:
            self.warmed_up.add(key)
            return self.fn(*args)
        recording = self.record(key, args)
        if recording is None:
            return self.fn(*args)
        return self.replay(recording, args)

    @staticmethod
    def static_inputs_moved(recording, args):
        return any(recording.static_inputs[i].data_ptr() != args[i].data_ptr() for i in recording.read_in_place)

    def record(self, key, args):
        in_place = self.static_positions | {i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)}
        in_place = frozenset(i for i in in_place if i < len(args) and isinstance(args[i], torch.Tensor))
        static_inputs = [a if i in in_place or not isinstance(a, torch.Tensor) else _like(a)
                         for i, a in enumerate(args)]
        for static, a in zip(static_inputs, args):
            if static is not a:
                static.copy_(a)
        try:
            if self.pool is None:
                self.pool = self.api.new_pool()
            replay, outputs = self.api.record(self.fn, static_inputs, self.pool)
        except Exception as e:  # never the user's failure: this signature runs without CUDA graphs
            log("perf_hints", "recording a CUDA graph raised %s: %s; the graph runs without one", type(e).__name__, e)
            self.failed.add(key)
            return None
        passed = {k: i for k, out in enumerate(outputs) for i in in_place if out is static_inputs[i]}
        recording = Recording(replay, static_inputs, tuple(outputs), in_place, passed)
        self.recordings[key] = recording
        return recording

    @staticmethod
    def replay(recording, args):
        for i, (static, a) in enumerate(zip(recording.static_inputs, args)):
            if i not in recording.read_in_place and isinstance(a, torch.Tensor):
                static.copy_(a)
        recording.replay()
        return tuple(args[recording.passed_through[k]] if k in recording.passed_through else
                     pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
                     for k, out in enumerate(recording.outputs))


def _like(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def wrap(fn, program, compiled, example_inputs, api=None):
    """`fn` replayed through CUDA graphs when `program` allows it (see `blocker`), else `fn` itself.
    Inputs that are module parameters are static (read in place)."""
    reason = blocker(program, compiled)
    if reason is None and not any(isinstance(x, torch.Tensor) for x in example_inputs):
        reason = "no tensor inputs"
    if reason is not None:
        log("perf_hints", "no CUDA graph for this graph: %s", reason)
        return fn
    static = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.nn.Parameter)]
    return CudaGraphRunner(fn, static, api)
