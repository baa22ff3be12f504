"""torch.func's transforms in captured code — `vmap`, `grad`, `grad_and_value`, `jacrev`, `jacfwd`,
`hessian` — each call of a transformed function one graph node.

`torch.func.grad(fn, argnums)(*args)`: capture interprets `fn` once into a subgraph
(OutputGraph.subgraph) on example arguments — the arguments themselves, or for vmap one sample of
each batched argument (its batch dim taken away) — and closes it (subgraphs.close: what it reads from
outside, a weight or a size, becomes an extra input that is not transformed). The graph gets ONE
node that applies the same transform, with the user's options, to that subgraph when it runs. The
fake run of the node gives the results' shapes; aot's make_fx traces through the transform into
ordinary aten ops (batched, or the derivative's), so the compiler sees nothing special. Transforms
nest: a transform called inside `fn` is a node of `fn`'s subgraph (vmap of grad: per-sample
gradients).

What the example trace cannot stand for raises Unsupported (a graph break at the call, which then runs
natively): keyword arguments, arguments that are containers, Python side effects inside `fn` (they
would happen once per trace, not per call of `fn`), a function that returns anything but tensors.
"""
import inspect

import torch
import torch.func

from kiln.capture import autograd_hooks, glue, subgraphs
from kiln.capture.objects import BUILTIN_HANDLERS, VARIABLE_MODELS, TypeModel, call, const_value
from kiln.capture.variables import TensorVariable, TupleVariable, Variable
from kiln.exc import Unsupported

TRANSFORMS = (torch.func.vmap, torch.func.grad, torch.func.grad_and_value, torch.func.jacrev,
              torch.func.jacfwd, torch.func.hessian)


class TransformedVariable(Variable):
    """`transform(fn, **options)` made in the frame (torch.vmap(f, in_dims=1)), not yet called."""

    def __init__(self, transform, fn, options):
        self.transform, self.fn, self.options = transform, fn, options

    def python_type(self):
        return type(lambda: None)


def _maker(transform):
    signature = inspect.signature(transform)

    def make(frame, args, kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise Unsupported(f"{transform.__name__}: {e}", python_exception=e) from e
        fn = bound.arguments.pop("func")
        options = {name: const_value(v, f"{transform.__name__}'s {name}") for name, v in bound.arguments.items()}
        return TransformedVariable(transform, fn, options)
    return make


class TransformedModel(TypeModel):
    def call(self, frame, v, args, kwargs):
        if kwargs:
            raise Unsupported(f"keyword arguments to a function made by {v.transform.__name__}")
        og = frame.og
        effects = og.side_effects.count()
        with og.subgraph(grad_enabled=og.grad_enabled) as raw:
            if v.transform is torch.func.vmap:
                inner, inputs, dims = _samples(og, args, v.options.get("in_dims", 0))
            else:
                inner, inputs, dims = _examples(og, args, v.transform.__name__), list(args), ()
            result = call(frame, v.fn, inner, {})
        if og.side_effects.count() != effects:
            raise Unsupported(f"a function under {v.transform.__name__} changes Python state "
                              "(it would happen once, not per call)")
        single = isinstance(result, TensorVariable)
        items = [result] if single else list(result.items) if isinstance(result, TupleVariable) else None
        if not items or not all(isinstance(r, TensorVariable) for r in items):
            raise Unsupported(f"a function under {v.transform.__name__} that returns anything but tensors")
        own = [a.node for a in inner if isinstance(a, TensorVariable) and a.node.graph is raw]
        closed = subgraphs.close(raw, own, [r.node for r in items], f"{v.transform.__name__}_fn")
        lifted = [subgraphs.outside_variable(n) for n in closed.lifted]
        target = _transformed(v, closed.gm, dims, len(lifted), single)
        return og.call_op("call_function", target, inputs + lifted, {})


def _samples(og, args, in_dims):
    """vmap: per argument, one sample of it (a placeholder) or the argument itself (in_dim None).
    -> (the arguments fn is traced with, the batched arguments, their batch dims)."""
    if isinstance(in_dims, int) or in_dims is None:
        in_dims = [in_dims] * len(args)
    elif not (isinstance(in_dims, (tuple, list)) and len(in_dims) == len(args)
              and all(d is None or isinstance(d, int) for d in in_dims)):
        raise Unsupported(f"vmap in_dims {in_dims!r} (an int or None per argument is modelled)")
    inner, batched, dims = [], [], []
    for a, d in zip(args, in_dims):
        if d is None:
            inner.append(a)  # read from outside: lifted, not batched
            continue
        if not isinstance(a, TensorVariable):
            raise Unsupported(f"vmap over a {a.python_type().__name__} argument (only tensors are batched here)")
        d = d + a.fake.dim() if d < 0 else d
        if not 0 <= d < a.fake.dim() or not a.fake.shape[d] >= 1:
            raise Unsupported("vmap: the batch dim is out of range or empty")
        with og.fake_mode:
            sample = a.fake.select(d, 0).clone()
        inner.append(TensorVariable(og.subgraph_input("vmap_sample", sample), sample))
        batched.append(a)
        dims.append(d)
    return inner, batched, tuple(dims)


def _examples(og, args, name):
    """The other transforms: fn traced on placeholders like the arguments (which must be tensors:
    argnums count them)."""
    if not all(isinstance(a, TensorVariable) for a in args):
        raise Unsupported(f"{name} of a function called with arguments that are not all tensors")
    inner = []
    for a in args:
        with og.fake_mode:
            example = a.fake.detach().clone()
        inner.append(TensorVariable(og.subgraph_input(f"{name}_arg", example), example))
    return inner


def _transformed(v, gm, batch_dims, num_lifted, single):
    """The node's target: (*transformed inputs, *lifted) -> the transform of the subgraph over them."""
    options = dict(v.options)
    if v.transform is torch.func.vmap:
        options["in_dims"] = batch_dims + (None,) * num_lifted

    def fn(*inputs):  # the user's function: one tensor or a tuple, as it returned
        results = gm(*inputs)
        return results[0] if single else results

    def transformed(*inputs):
        with autograd_hooks.exposed():  # (grad transforms refuse any saved-tensor hooks)
            return v.transform(fn, **options)(*inputs)
    transformed.__name__ = transformed.__qualname__ = v.transform.__name__
    return transformed


def _rebuild(g, v):
    """A transformed function left on the stack at a graph break: the same call, made natively."""
    options = "".join(f", {name}={g.const(value, 'OPT')}" for name, value in v.options.items())
    return f"{g.const(v.transform, 'TRANSFORM')}({g.value(v.fn)}{options})"


for _transform in TRANSFORMS:
    BUILTIN_HANDLERS[_transform] = _maker(_transform)
VARIABLE_MODELS[TransformedVariable] = TransformedModel()
glue.REBUILDERS[TransformedVariable] = _rebuild
