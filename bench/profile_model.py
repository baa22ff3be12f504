"""Where the time of a compiled call goes: `python -m bench.profile_model MODEL [MODEL ...]`.

For each model (a bench/vision_models name, or hf:NAME for a bench/zoo architecture), in one process, one thread by default:

- eager, kiln (and with --torch, torch.compile) timed interleaved: median ms per call and the noise;
- minor page faults per call (getrusage) and peak bytes allocated during one call (torch.profiler's
  memory events: every tensor allocation and free, in order);
- kiln's call broken down: time in its native kernels (top ones by name), in each aten op it calls
  (externs), layout copies the wrapper made (fix_layout), the wrapper's own Python, and what is left
  of the call outside the graph (guards, argument handling, output rebuild);
- eager's call by aten op (timed by a dispatch mode), split into the ops kiln also leaves to aten (convolution,
  matmul, attention) and the rest (what kiln's kernels replace).

The breakdown instruments the compiled graph's wrapper in place: every native entry and aten
callable in the wrapper's globals is replaced by a timing shim (so numbers include ctypes' call cost).
Options: --size, --batch, --threads, --freezing (compile with options={"freezing": True}), --train
(one training step instead of eval), --calls.
"""
import argparse
import gc
import resource
import statistics
import time
import types
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

clock = time.thread_time  # what every time here is read with (see --clock)

# ops both eager and kiln run through aten (kiln's decompositions keep them whole)
HEAVY_OPS = ("conv", "linear", "addmm", "mm", "bmm", "matmul", "attention", "baddbmm")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.profile_model", description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--size", type=int, default=224, help="image side, or tokens for hf: models")
    p.add_argument("--scale", type=int, default=2, help="hf: models: hidden size 64 * scale")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=8, help="timed calls per compiler (interleaved)")
    p.add_argument("--freezing", action="store_true")
    p.add_argument("--train", action="store_true")
    p.add_argument("--torch", action="store_true", help="also time torch.compile (same options)")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="cpu: this thread's CPU time (steady on a shared machine; right for --threads 1), wall")
    return p.parse_args(argv)


class GraphRecorder:
    """Keeps every graph function kiln's wrapper builder makes while compiling (with its program)."""

    def __init__(self):
        self.graphs = []

    def __enter__(self):
        from kiln.compiler import wrapper
        self._build = wrapper.build

        def build(program, *args, **kwargs):
            fn, source = self._build(program, *args, **kwargs)
            self.graphs.append((fn, program))
            return fn, source
        wrapper.build = build
        return self

    def __exit__(self, *exc):
        from kiln.compiler import wrapper
        wrapper.build = self._build


class StepTimer:
    """Replaces each native entry, aten callable and fix_layout in a graph function's globals with a
    shim that adds its wall time to a per-name total."""

    def __init__(self, graphs):
        self.totals = defaultdict(float)
        self.counts = defaultdict(int)
        self.copies = 0            # fix_layout calls that copied
        self.graph_s = 0.0         # wall time inside the graph functions
        for fn, program in graphs:
            self._instrument(fn, program)

    def _instrument(self, fn, program):
        scope = fn.__globals__
        kernels_of = _entry_kernels(fn, program)
        for name, value in list(scope.items()):
            if name.startswith("entry"):
                scope[name] = self._shim(value, "kernel " + kernels_of.get(name, name))
            elif name.startswith("aten_"):
                scope[name] = self._aten_shim(value)
            elif name == "fix_layout":
                scope[name] = self._fix_layout(value)
        graph = types.FunctionType(fn.__code__, scope, "kiln_graph_original", fn.__defaults__)

        def timed_graph(*args):
            begin = clock()
            try:
                return graph(*args)
            finally:
                self.graph_s += clock() - begin
        scope["kiln_graph_timed"] = timed_graph
        fn.__code__ = _call_through(fn.__code__)

    def _shim(self, fn, label):
        def shim(*args, **kwargs):
            begin = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[label] += clock() - begin
                self.counts[label] += 1
        return shim

    def _aten_shim(self, op):
        """A timed stand-in for an aten op, also where the wrapper calls the op's C++ callable (`op._op`)."""
        shim = self._shim(op, "aten " + str(op))
        if hasattr(op, "_op"):
            shim._op = self._shim(op._op, "aten " + str(op))
        return shim

    def _fix_layout(self, fn):
        def shim(t, size, stride):
            out = fn(t, size, stride)
            if out is not t:
                self.copies += 1
            return out
        return shim

    def reset(self):
        self.totals.clear()
        self.counts.clear()
        self.copies, self.graph_s = 0, 0.0


def _call_through(code):
    """The code of `def kiln_graph(*args): return kiln_graph_timed(*args)` with kiln_graph's
    signature (the graph function object stays the one callers hold)."""
    names = code.co_varnames[:code.co_argcount]
    src = f"def kiln_graph({', '.join(names)}):\n    return kiln_graph_timed({', '.join(names)})\n"
    scope = {}
    exec(compile(src, "<profiled kiln graph>", "exec"), scope)
    return scope["kiln_graph"].__code__


def _entry_kernels(fn, program):
    """{wrapper global name of a native entry: what its kernels compute}, read from the wrapper
    source: each kernel as name[outer points x reduction length, its reductions]."""
    import re
    from kiln.compiler.schedule import Kernel
    by_node = {n.name: k for k in program.steps if isinstance(k, Kernel) for n in k.nodes}
    out = {}
    for line in (getattr(fn, "kiln_wrapper", None) or "").splitlines():
        m = re.match(r"\s*(entry\d+)\((.*)\)", line)
        if m:
            written = [a.split(".")[0] for a in m.group(2).split(", ")]
            kernels = {id(by_node[b]): by_node[b] for b in written if b in by_node}.values()
            out[m.group(1)] = ",".join(_describe_kernel(k) for k in kernels) or m.group(1)
    return out


def _describe_kernel(k):
    reductions = "".join(f" {n.reduction_type}" for n in k.nodes if n.is_reduction)
    return f"{k.name}[{k.numel}x{k.rnumel}{reductions}]"


def build_model(name, args):
    """(model, (positional inputs, keyword inputs) of one call): a bench/vision_models name, or `hf:NAME` for a bench/zoo
    architecture (hidden 64 * --scale, --size tokens)."""
    if name.startswith("hf:"):
        from bench.zoo import BY_NAME
        arch = BY_NAME[name[3:]]
        model = arch.build(args.scale)
        return (model.train() if args.train else model), ((), arch.inputs(args.size, args.batch))
    from bench.vision_models import MODELS, init_weights
    torch.manual_seed(0)
    model = init_weights(MODELS[name]())
    x = torch.randn(args.batch, 3, args.size, args.size)
    return (model.train() if args.train else model.eval()), ((x,), {})


def make_call(model, inputs, train):
    args, kwargs = inputs
    if not train:
        return lambda m: m(*args, **kwargs)

    def step(m):
        for p in model.parameters():
            p.grad = None
        first_output(m(*args, **kwargs)).square().mean().backward()
    return step


def first_output(out):
    from bench.zoo import first_tensor
    return first_tensor(out)


def compile_kiln(model, freezing):
    import kiln
    return kiln.compile(model, options={"freezing": True, "graph_cache": False} if freezing
                        else {"graph_cache": False})


def compile_torch(model, freezing):
    import torch._inductor.config as inductor_config
    inductor_config.freezing = freezing
    return torch.compile(model)


def interleaved(calls, rounds):
    """{name: [seconds per call]} over `rounds` rounds, the starting compiler rotating."""
    samples = {name: [] for name in calls}
    names = list(calls)
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                begin = clock()
                calls[name]()
                samples[name].append(clock() - begin)
    finally:
        gc.enable()
    return samples


def faults_per_call(call, calls=3):
    call()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        call()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def peak_bytes(call):
    """Most bytes held at once by tensors allocated during one call (their frees counted in order)."""
    from torch.profiler import ProfilerActivity, profile
    call()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    # an allocation or free inside an op counts at the op's start (its self memory); "[memory]" events
    # are those made outside any op (the wrapper's frees)
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    held = peak = 0
    for e in events:
        held += e.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


class _OpTimer(TorchDispatchMode):
    """Times each aten op eager dispatches (after composite ops are broken up, so the names are the
    ones kiln's aten calls carry: aten.convolution.default)."""

    def __init__(self):
        super().__init__()
        self.totals = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        begin = clock()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.totals[str(func)] += clock() - begin


def eager_ops(call, calls=3):
    """{aten op: seconds per call} of eager calls."""
    call()
    with _OpTimer() as timer:
        for _ in range(calls):
            call()
    return {op: t / calls for op, t in timer.totals.items()}


def _heavy(name):
    short = name.removeprefix("aten ").removeprefix("aten.").split(".")[0]
    return any(h in short for h in HEAVY_OPS)


def _ms(seconds):
    return f"{seconds * 1e3:.2f} ms"


def profile_one(name, args):
    model, inputs = build_model(name, args)
    call = make_call(model, inputs, args.train)
    grad = torch.enable_grad() if args.train else torch.no_grad()
    with grad:
        if args.torch:  # first: torch.compile edits the model's class, which makes kiln recompile
            torch_model = compile_torch(model, args.freezing)
            call(torch_model)
        with GraphRecorder() as recorder:
            begin = clock()
            kiln_model = compile_kiln(model, args.freezing)
            call(kiln_model)
            compile_s = clock() - begin
        calls = {"eager": lambda: call(model), "kiln": lambda: call(kiln_model)}
        if args.torch:
            calls["torch"] = lambda: call(torch_model)
        for c in calls.values():
            c()
        samples = interleaved(calls, args.calls)
        faults = {n: faults_per_call(c) for n, c in calls.items()}
        peaks = {n: peak_bytes(c) for n, c in calls.items() if n != "torch"}
        eager = eager_ops(calls["eager"])
        timer = StepTimer(recorder.graphs)
        kiln_total = _timed(calls["kiln"], timer, args.calls)
    med = {n: statistics.median(s) for n, s in samples.items()}
    noise = {n: (statistics.quantiles(s, n=4)[2] - statistics.quantiles(s, n=4)[0]) / 2 / med[n]
             for n, s in samples.items()}
    mode = ("train step" if args.train else "eval") + (", freezing" if args.freezing else "") + f", {args.clock} time"
    print(f"## {name} ({mode}, batch {args.batch}, size {args.size}, {args.threads} thread(s); "
          f"kiln compile + first call {compile_s:.1f} s, {len(recorder.graphs)} graph(s))")
    for n in calls:
        line = f"- {n:6} {_ms(med[n]):>11} ±{noise[n] * 100:.0f}%  {med['eager'] / med[n]:.2f}x of eager"
        line += f"   faults/call {faults[n]:8.0f}"
        if n in peaks:
            line += f"   peak {peaks[n] / 2**20:7.1f} MB"
        print(line)
    _breakdown(timer, eager, kiln_total, args)
    print()


def _timed(call, timer, calls):
    """Seconds per call of `call` with the step timer on; the timer's totals become per call too."""
    timer.reset()
    begin = clock()
    for _ in range(calls):
        call()
    total = (clock() - begin) / calls
    for key in timer.totals:
        timer.totals[key] /= calls
        timer.counts[key] //= calls
    timer.copies //= calls
    timer.graph_s /= calls
    return total


def _breakdown(timer, eager, kiln_total, args):
    kernels = {k: v for k, v in timer.totals.items() if k.startswith("kernel")}
    externs = {k: v for k, v in timer.totals.items() if k.startswith("aten")}
    kernel_s, extern_s = sum(kernels.values()), sum(externs.values())
    heavy_extern = sum(v for k, v in externs.items() if _heavy(k))
    eager_heavy = sum(v for k, v in eager.items() if _heavy(k))
    eager_rest = sum(v for k, v in eager.items() if not _heavy(k))
    print(f"- kiln call (instrumented, mean of {args.calls}): {_ms(kiln_total)} = graph {_ms(timer.graph_s)} "
          f"[kernels {_ms(kernel_s)} in {sum(timer.counts[k] for k in kernels)} calls, aten {_ms(extern_s)} in "
          f"{sum(timer.counts[k] for k in externs)} calls, wrapper Python {_ms(timer.graph_s - kernel_s - extern_s)}, "
          f"layout copies {timer.copies}] + outside the graph (guards, glue) {_ms(kiln_total - timer.graph_s)}")
    print(f"- heavy ops (aten in both): eager {_ms(eager_heavy)}, kiln {_ms(heavy_extern)};  "
          f"the rest: eager's other ops {_ms(eager_rest)} vs kiln's kernels {_ms(kernel_s)} "
          f"+ other aten {_ms(extern_s - heavy_extern)}")
    print("- kiln aten calls: " + ", ".join(f"{k[5:]} {_ms(v)} x{timer.counts[k]}"
                                            for k, v in sorted(externs.items(), key=lambda kv: -kv[1])[:args.top]))
    print("- kiln top kernels: " + ", ".join(f"{k[7:][:60]} {_ms(v)}"
                                             for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:args.top]))
    print("- eager aten ops: " + ", ".join(f"{k[5:]} {_ms(v)}"
                                          for k, v in sorted(eager.items(), key=lambda kv: -kv[1])[:args.top]))


def main(argv=None):
    global clock
    args = parse_args(argv)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    for name in args.models:
        profile_one(name, args)


if __name__ == "__main__":
    main()
