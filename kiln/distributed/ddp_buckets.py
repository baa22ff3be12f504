"""Graphs compiled under DistributedDataParallel are split at its gradient buckets (what torch.compile
calls its DDPOptimizer), so that each bucket's all-reduce starts while the rest of the backward runs.

DDP all-reduces gradients in buckets of about `bucket_cap_mb`, filled with the parameters in the order
backward produces their gradients (reverse use order); the reducer's hooks start a bucket's all-reduce
once all its gradients are accumulated. A graph compiled for training is one autograd node: every
gradient it computes appears at once, when its whole backward is done, so no all-reduce could start
before the end of the backward. Split into one graph per bucket, each compiled on its own, the
backward runs graph by graph, last bucket first, and each bucket's gradients are ready (and its
all-reduce in flight) as soon as its own graph's backward is done.

The plan: walk the graph from its output back, putting each node into the current bucket and
counting the bytes of the parameters it reads for the first time (a parameter belongs to the bucket
of its last use); once a bucket holds its cap (the first bucket: DDP's smaller first cap), the next
node that reads a new parameter starts a new bucket. torch.fx's split_module cuts the graph into one
submodule per bucket. Each is compiled by the backend at its first call, on the values that reach it
(the backend contract is real example inputs; their symbolic fake values, for dynamic sizes, are on
the placeholders, copied from the whole graph).
"""
import dataclasses
import threading
import warnings

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from kiln.config import config as settings  # (the settings object, however kiln.config is bound)
from kiln.capture import autograd_hooks
from kiln.debug.logs import enabled, log
from kiln.exc import BackendCompilerFailed

try:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:  # a torch built without torch.distributed
    DDP = None


def backend_for_frame(backend):
    """The backend to compile a frame with: `backend`, or, while a DDP module runs the module it wraps
    (DDP marks itself active around that call) and kiln.config.optimize_ddp is on, one that splits
    each graph at that DDP module's buckets."""
    if DDP is None or not settings.optimize_ddp or not dist.is_available():
        return backend
    ddp = DDP._get_active_ddp_module()
    if ddp is None:
        return backend
    return BucketSplitter(backend, bucket_caps(ddp))


def bucket_caps(ddp):
    """The byte caps of DDP's buckets in backward order; the last one repeats."""
    listed = list(getattr(ddp, "bucket_bytes_cap_list", None) or ())
    if listed:
        return listed
    cap = ddp.bucket_bytes_cap
    if getattr(ddp, "bucket_bytes_cap_default", False):  # bucket_cap_mb not given: a small first bucket
        return [min(dist._DEFAULT_FIRST_BUCKET_BYTES, cap), cap]
    return [cap]


@dataclasses.dataclass
class Bucket:
    nodes: list = dataclasses.field(default_factory=list)   # fx nodes, in backward order while planning
    params: list = dataclasses.field(default_factory=list)  # names of the parameter placeholders it reads
    nbytes: int = 0


def plan_buckets(gm, example_inputs, caps):
    """The graph's nodes grouped into buckets, in forward order (see the module docstring)."""
    sizes = _parameter_bytes(gm, example_inputs)
    buckets, counted = [Bucket()], set()
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        new = [p for p in node.all_input_nodes if p in sizes and p not in counted]
        if new and buckets[-1].nbytes >= caps[min(len(buckets), len(caps)) - 1]:
            buckets.append(Bucket())
        bucket = buckets[-1]
        for p in new:
            counted.add(p)
            bucket.params.append(p.name)
            bucket.nbytes += sizes[p]
        bucket.nodes.append(node)
    buckets.reverse()
    for b in buckets:
        b.nodes.reverse()
    return buckets


def _parameter_bytes(gm, example_inputs):
    """Placeholder -> bytes, for the parameters DDP all-reduces (requiring grad, not ignored)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    return {node: value.numel() * value.element_size() for node, value in zip(placeholders, example_inputs)
            if isinstance(value, torch.nn.Parameter) and value.requires_grad and not getattr(value, "_ddp_ignored", False)}


class BucketSplitter:
    """A backend (the same contract as the one it wraps) that compiles a graph as one graph per bucket."""

    def __init__(self, backend, caps):
        self.backend, self.caps = backend, caps
        self.name = getattr(backend, "name", getattr(backend, "__name__", type(backend).__name__))

    def __call__(self, gm, example_inputs):
        buckets = plan_buckets(gm, example_inputs, self.caps)
        if enabled("ddp"):
            log("ddp", "DDP buckets (caps %s bytes) for a graph of %d nodes: %s", self.caps, len(gm.graph.nodes),
                "; ".join(f"{len(b.nodes)} nodes, {b.nbytes} bytes of {b.params}" for b in buckets))
        if len(buckets) == 1:
            return self.backend(gm, example_inputs)
        bucket_of = {node: i for i, b in enumerate(buckets) for node in b.nodes}
        split = split_module(gm, None, lambda node: bucket_of[node])
        for node in split.graph.find_nodes(op="call_module"):
            setattr(split, node.target, _CompiledOnFirstCall(getattr(split, node.target), self.backend, self.name))
        return split


class _CompiledOnFirstCall(torch.nn.Module):
    """One bucket's graph, compiled by `backend` on the inputs of its first call."""

    def __init__(self, gm, backend, name):
        super().__init__()
        self.__dict__.update(gm=gm, backend=backend, backend_name=name, compiled=None, lock=threading.Lock())

    def forward(self, *args):
        compiled = self.compiled
        if compiled is None:
            with self.lock:
                if self.compiled is None:
                    self.compiled = self._compile(list(args))
                compiled = self.compiled
        return compiled(*args)

    def _compile(self, example_inputs):
        try:
            with autograd_hooks.hidden():  # the program's saved-tensor hooks are for its own ops
                return self.backend(self.gm, example_inputs)
        except Exception as e:
            if not settings.suppress_errors:
                raise BackendCompilerFailed(self.backend_name, e) from e
            warnings.warn(f"kiln: backend {self.backend_name!r} raised {type(e).__name__}: {e}; "
                          f"one DDP bucket's graph runs eagerly")
            return self.gm.forward

