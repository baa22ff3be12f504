"""`torch.vmap(fn, in_dims, out_dims)(*args)` in captured code: one graph node that vmaps a subgraph.

Capture interprets `fn` once, on one sample of each batched argument (the argument with its batch dim
taken away), into a subgraph (OutputGraph.subgraph), closes it (subgraphs.close: what it reads from
outside, a weight or a size, becomes an input that is not batched), and records ONE node: a call that
runs `torch.vmap` over that subgraph with the user's in_dims, out_dims, randomness and chunk_size.
The fake run of the node gives the results' shapes; aot's make_fx traces through torch.vmap into
batched aten ops, so the compiler sees ordinary ops.

What the sample trace cannot stand for raises Unsupported (a graph break at the call, which then runs
natively): keyword arguments, arguments that are containers, Python side effects inside `fn`
(they would happen once, not per sample), a function that returns anything but tensors.
"""
import torch

from kiln.capture import glue, subgraphs
from kiln.capture.objects import BUILTIN_HANDLERS, VARIABLE_MODELS, TypeModel, call, const_value
from kiln.capture.variables import TensorVariable, TupleVariable, Variable
from kiln.exc import Unsupported


class VmapVariable(Variable):
    """`torch.vmap(fn, ...)` made in the frame, not yet called."""

    def __init__(self, fn, in_dims, out_dims, randomness, chunk_size):
        self.fn, self.in_dims, self.out_dims = fn, in_dims, out_dims
        self.randomness, self.chunk_size = randomness, chunk_size

    def python_type(self):
        return type(lambda: None)


_VMAP_PARAMS = ("func", "in_dims", "out_dims", "randomness", "chunk_size")
_VMAP_DEFAULTS = {"in_dims": 0, "out_dims": 0, "randomness": "error", "chunk_size": None}


def make_vmap(frame, args, kwargs):
    """torch.vmap(func, in_dims=0, out_dims=0, randomness='error', *, chunk_size=None)."""
    bound = dict(zip(_VMAP_PARAMS, args))
    for name, value in kwargs.items():
        if name not in _VMAP_PARAMS or name in bound:
            raise Unsupported(f"torch.vmap: unexpected argument {name!r}", python_exception=TypeError(name))
        bound[name] = value
    if "func" not in bound:
        raise Unsupported("torch.vmap needs a function", python_exception=TypeError("func"))
    options = {name: const_value(bound[name], f"vmap's {name}") if name in bound else default
               for name, default in _VMAP_DEFAULTS.items()}
    return VmapVariable(bound["func"], **options)


class VmapModel(TypeModel):
    def call(self, frame, v, args, kwargs):
        if kwargs:
            raise Unsupported("keyword arguments to a vmapped function")
        in_dims = _per_argument(v.in_dims, args)
        og = frame.og
        effects = og.side_effects.count()
        with og.subgraph(grad_enabled=og.grad_enabled) as raw:
            inner, own, batched = [], [], []
            for a, d in zip(args, in_dims):
                if d is None:
                    inner.append(a)
                    continue
                if not isinstance(a, TensorVariable):
                    raise Unsupported(f"vmap over a {a.python_type().__name__} argument (only tensors are batched here)")
                d = d + a.fake.dim() if d < 0 else d
                if not 0 <= d < a.fake.dim() or not a.fake.shape[d] >= 1:
                    raise Unsupported("vmap: the batch dim is out of range or empty")
                with og.fake_mode:
                    sample = a.fake.select(d, 0).clone()
                node = og.subgraph_input("vmap_sample", sample)
                inner.append(TensorVariable(node, sample))
                own.append(node)
                batched.append((a, d))
            result = call(frame, v.fn, inner, {})
        if og.side_effects.count() != effects:
            raise Unsupported("a vmapped function changes Python state (it would happen once, not per sample)")
        single = isinstance(result, TensorVariable)
        items = [result] if single else list(result.items) if isinstance(result, TupleVariable) else None
        if items is None or not items or not all(isinstance(r, TensorVariable) for r in items):
            raise Unsupported("a vmapped function that returns anything but tensors")
        closed = subgraphs.close(raw, own, [r.node for r in items], "VmappedFunction")
        lifted = [subgraphs.outside_variable(n) for n in closed.lifted]
        target = _vmapped(closed.gm, tuple(d for _, d in batched), len(lifted), single, v)
        return og.call_op("call_function", target, [a for a, _ in batched] + lifted, {})


def _per_argument(in_dims, args):
    if isinstance(in_dims, int) or in_dims is None:
        return [in_dims] * len(args)
    if isinstance(in_dims, (tuple, list)) and len(in_dims) == len(args) and \
            all(d is None or isinstance(d, int) for d in in_dims):
        return list(in_dims)
    raise Unsupported(f"vmap in_dims {in_dims!r} (an int or None per argument is modelled)")


def _vmapped(gm, in_dims, num_lifted, single, v):
    """The node's target: (*batched inputs, *lifted) -> torch.vmap of the subgraph over them."""
    def vmapped(*inputs):
        run = torch.vmap(gm, in_dims=in_dims + (None,) * num_lifted, out_dims=v.out_dims,
                         randomness=v.randomness, chunk_size=v.chunk_size)
        results = run(*inputs)
        return results[0] if single else results
    vmapped.__name__ = vmapped.__qualname__ = "vmapped"
    return vmapped


def _rebuild(g, v):
    """A vmapped function left on the stack at a graph break: the same torch.vmap call, made natively."""
    options = ", ".join(f"{name}={g.const(getattr(v, name), 'VMAP_OPT')}" for name in _VMAP_DEFAULTS)
    return f"{g.const(torch.vmap, 'VMAP')}({g.value(v.fn)}, {options})"


BUILTIN_HANDLERS[torch.vmap] = make_vmap
glue.REBUILDERS[VmapVariable] = _rebuild
VARIABLE_MODELS[VmapVariable] = VmapModel()
