"""Scenarios run on every rank of a process group (see launcher.py): each trains or runs a program
eagerly and compiled on the same data and returns both results (and graph counts) for the test
process to compare. Each rank feeds different data, so DDP's all-reduce has something to average.
"""
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from tests.utils import counting_backend

STEPS = 3


class MLP(torch.nn.Module):
    def __init__(self, width=16, depth=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 2)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def _batch(rank, step, width=16):
    g = torch.Generator().manual_seed(1000 + 10 * rank + step)
    return torch.randn(8, width, generator=g)


def train(wrap, rank, make_model=MLP, steps=STEPS, accumulate=1, batch=_batch):
    """Train a fresh model (same initial weights on every rank) `steps` SGD steps; `wrap(model)` is
    what the steps call. With `accumulate` > 1, each step accumulates that many batches, all but the
    last under the DDP module's no_sync(). Returns losses, gradients before each step and final
    parameters."""
    torch.manual_seed(0)
    model = make_model()
    run = wrap(model)
    ddp = _ddp_of(run) if accumulate > 1 else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        for micro in range(accumulate):
            sync = micro == accumulate - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                loss = run(batch(rank, step * accumulate + micro)).pow(2).mean()
                loss.backward()
            losses.append(loss.detach())
        grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return {"losses": losses, "grads": grads, "params": [p.detach().clone() for p in model.parameters()]}


def _ddp_of(run):
    """The DDP module inside `run` (DDP itself, or kiln's wrapper around it)."""
    return run if isinstance(run, DDP) else getattr(run, "_orig_mod", run)


def _compare(rank, wrap_compiled, backend="aot_eager", make_model=MLP, accumulate=1, batch=_batch, **ddp_kwargs):
    eager = train(lambda m: DDP(m, **ddp_kwargs), rank, make_model, accumulate=accumulate, batch=batch)
    counter = counting_backend(backend)
    compiled = train(lambda m: wrap_compiled(m, counter, ddp_kwargs), rank, make_model, accumulate=accumulate,
                     batch=batch)
    params = [sorted(n.name for n in g.graph.find_nodes(op="placeholder") if "parameters" in n.name)
              for g in counter.graphs]
    return {"eager": eager, "compiled": compiled, "graphs": counter.frame_count, "params": params}


def _outer(m, backend, ddp_kwargs):
    return kiln.compile(DDP(m, **ddp_kwargs), backend=backend)


def _inner(m, backend, ddp_kwargs):
    return DDP(kiln.compile(m, backend=backend), **ddp_kwargs)


class SometimesUnused(torch.nn.Module):
    """A layer used only when the input's mean is positive: a parameter without a gradient on some
    steps and ranks (DDP's find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.extra = torch.nn.Linear(16, 16)
        self.body = MLP()

    def forward(self, x):
        if x.mean() > 0:  # a data-dependent branch: a graph break either way
            x = self.extra(x)
        return self.body(x)


def ddp_outer(rank, world):
    """kiln.compile(DDP(model))."""
    return _compare(rank, _outer)


def ddp_inner(rank, world):
    """DDP(kiln.compile(model))."""
    return _compare(rank, _inner)


def ddp_outer_inductor(rank, world):
    """kiln's own compiler, each of two bucket graphs compiled for training."""
    return _compare(rank, _outer, backend="inductor", make_model=_wide, batch=_wide_batch, bucket_cap_mb=0.02)


def ddp_no_sync(rank, world):
    return {"outer": _compare(rank, _outer, accumulate=2), "inner": _compare(rank, _inner, accumulate=2)}


def ddp_find_unused(rank, world):
    return {"outer": _compare(rank, _outer, make_model=SometimesUnused, find_unused_parameters=True),
            "inner": _compare(rank, _inner, make_model=SometimesUnused, find_unused_parameters=True)}


def ddp_static_graph(rank, world):
    return {"outer": _compare(rank, _outer, static_graph=True), "inner": _compare(rank, _inner, static_graph=True)}


def _wide():
    """Layers of 64x64 (16,640 bytes of weight and bias each) and a 64->2 head (520 bytes)."""
    return MLP(width=64, depth=4)


def _wide_batch(rank, step):
    return _batch(rank, step, width=64)


def ddp_buckets(rank, world):
    """Graphs split at DDP's gradient buckets, for several bucket_cap_mb (in MiB), and in the other
    wrapping order."""
    results = {cap_mb: _compare(rank, _outer, make_model=_wide, batch=_wide_batch, bucket_cap_mb=cap_mb)
               for cap_mb in (1e-6, 0.02, 25)}
    results["inner"] = _compare(rank, _inner, make_model=_wide, batch=_wide_batch, bucket_cap_mb=0.02)
    return results


def ddp_overlap(rank, world):
    """The order of events in the backward of the third step: each bucket's all-reduce launch (a DDP
    comm hook) and the gradient of the input (the very end of the backward). DDP rebuilds its
    buckets after the first step, so later steps show the split's effect."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def events_of(wrap, cap_mb):
        torch.manual_seed(0)
        model = _wide()
        run = wrap(model, cap_mb)
        events = []
        _ddp_of(run).register_comm_hook(None, lambda state, bucket: events.append(f"allreduce {bucket.index()}")
                                        or allreduce_hook(None, bucket))
        for step in range(3):
            events.clear()
            x = _wide_batch(rank, step).requires_grad_()
            x.register_hook(lambda g: events.append("input grad"))
            run(x).pow(2).mean().backward()
        return list(events)
    return {"eager": events_of(lambda m, cap: DDP(m, bucket_cap_mb=cap), 0.02),
            "split": events_of(lambda m, cap: _outer(m, "aot_eager", {"bucket_cap_mb": cap}), 0.02),
            "one bucket": events_of(lambda m, cap: _outer(m, "aot_eager", {"bucket_cap_mb": cap}), 25)}


def _run_both(fn, *args, backend="aot_eager"):
    """fn eagerly and compiled on clones of args: results and args after the call of each, and the
    number of graphs compiled."""
    eager_args = [a.clone() for a in args]
    compiled_args = [a.clone() for a in args]
    expected = _waited(fn(*eager_args))
    counter = counting_backend(backend)
    actual = _waited(kiln.compile(fn, backend=counter)(*compiled_args))
    return {"eager": {"out": expected, "args": eager_args}, "compiled": {"out": actual, "args": compiled_args},
            "graphs": counter.frame_count}


def _waited(t):
    """Eager functional collectives return an AsyncCollectiveTensor: its value, as a plain tensor."""
    return t.wait() if hasattr(t, "trigger_wait") else t


def _allreduce_inplace(x):
    y = x * 2
    dist.all_reduce(y)
    return y + 1


def _allreduce_inplace_max(x):
    y = x.sin()
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    dist.broadcast(x, src=0)
    return y * x


def _functional_allreduce(x):
    from torch.distributed import _functional_collectives as funcol
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    return y + 1


def _functional_gather_scatter(x):
    from torch.distributed import _functional_collectives as funcol
    gathered = funcol.all_gather_tensor(x + 1, 0, dist.group.WORLD)
    return funcol.reduce_scatter_tensor(gathered * 3, "sum", 0, dist.group.WORLD)


def _async_allreduce(x):
    y = x * 2
    work = dist.all_reduce(y, async_op=True)
    work.wait()
    return y + 1


def _gather_scatter_inplace(x):
    world = dist.get_world_size()
    gathered = x.new_empty(world * x.shape[0], *x.shape[1:])
    dist.all_gather_into_tensor(gathered, x.cos())
    out = torch.empty_like(x)
    dist.reduce_scatter_tensor(out, gathered * 2, op=dist.ReduceOp.SUM)
    return out + x


def _rank_dependent(x):
    """Each rank compiles a graph of its own (the rank is a constant to capture); the collective
    between them still pairs up."""
    if dist.get_rank() == 0:
        x = x * 3
    dist.all_reduce(x)
    return x.relu()


COLLECTIVE_PROGRAMS = {"allreduce_inplace": _allreduce_inplace, "allreduce_max_broadcast": _allreduce_inplace_max,
                       "functional_allreduce": _functional_allreduce,
                       "functional_gather_scatter": _functional_gather_scatter,
                       "gather_scatter_inplace": _gather_scatter_inplace, "async_allreduce": _async_allreduce,
                       "rank_dependent": _rank_dependent}


def collectives(rank, world):
    x = torch.arange(8.0).reshape(4, 2) + rank
    results = {name: _run_both(fn, x) for name, fn in COLLECTIVE_PROGRAMS.items()}
    for name in ("allreduce_inplace", "functional_gather_scatter", "gather_scatter_inplace"):
        results[name + " inductor"] = _run_both(COLLECTIVE_PROGRAMS[name], x, backend="inductor")
    return results


class Checkpointed(MLP):
    """The hidden layers run under torch.utils.checkpoint (non-reentrant, as DDP recommends)."""

    def forward(self, x):
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(lambda t, layer=layer: torch.tanh(layer(t)), x, use_reentrant=False)
        return self.head(x)


def ddp_checkpoint(rank, world):
    return {"outer": _compare(rank, _outer, make_model=Checkpointed),
            "inner": _compare(rank, _inner, make_model=Checkpointed)}


def _fsdp(model, mesh=None):
    """FSDP2: each hidden layer, then the whole model, sharded over the ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full(params):
    """Gathered full tensors of FSDP2's sharded parameters (DTensors), so ranks compare whole values."""
    return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in params]


def _train_fsdp(wrap, rank, make_model):
    result = train(lambda m: wrap(_fsdp(m)), rank, make_model)
    return {"losses": result["losses"], "grads": [_full(g) for g in result["grads"]], "params": _full(result["params"])}


def _compare_fsdp(rank, make_model=MLP, backend="aot_eager"):
    eager = _train_fsdp(lambda m: m, rank, make_model)
    counter = counting_backend(backend)
    compiled = _train_fsdp(lambda m: kiln.compile(m, backend=counter), rank, make_model)
    return {"eager": eager, "compiled": compiled, "graphs": counter.frame_count}


def fsdp(rank, world):
    """kiln.compile(model) with FSDP2 on each hidden layer and the root: alone, with kiln's compiler,
    and with each layer under activation checkpointing."""
    return {"plain": _compare_fsdp(rank), "inductor": _compare_fsdp(rank, backend="inductor"),
            "checkpoint": _compare_fsdp(rank, make_model=Checkpointed)}
