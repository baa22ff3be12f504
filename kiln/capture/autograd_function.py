"""`torch.autograd.Function.apply` in captured code: its forward goes into the graph, its backward into
training's backward.

When no input needs a gradient (inference, no_grad), `apply` is the forward run without grad, so it
is inlined into the graph like any function. Otherwise capture interprets the user's `forward` and
`backward` into two subgraphs (OutputGraph.subgraph), closes them (subgraphs.close: what they read
from outside becomes their inputs) and puts ONE node into the graph: a call of `_TracedFunction`, an
autograd.Function of kiln's own whose forward runs the forward graph and whose backward runs the
backward graph. Backends see an ordinary callable; aot's make_fx traces through it, so the forward's
ops land in the forward graph and the user's backward (not autograd's derivative of the forward) in
the joint backward graph.

The ctx is a `FunctionCtxVariable`: `save_for_backward`/`saved_tensors`, `mark_non_differentiable`,
`needs_input_grad`, `set_materialize_grads(True)` and plain attributes. What cannot be traced
(`mark_dirty`, in-place writes to inputs, side effects in backward, data-dependent Python) raises
Unsupported: a graph break at the `apply` call, which then runs natively.
"""
import dataclasses
import inspect

import torch

from kiln import torch_compat
from kiln.capture import subgraphs
from kiln.capture.objects import BUILTIN_HANDLERS, call, const_value, getattr_var, is_same, wrap_const
from kiln.capture.variables import (ConstantVariable, HandlerVariable, MethodVariable,
                                    TensorVariable, TupleVariable, Variable, const)
from kiln.exc import Unsupported

_FUNCTION = torch.autograd.Function
_DEFAULT_SETUP_CONTEXT = inspect.getattr_static(_FUNCTION, "setup_context")
_CTX_METHODS = ("save_for_backward", "mark_non_differentiable", "set_materialize_grads", "mark_dirty",
                "save_for_forward")


class FunctionCtxVariable(HandlerVariable):
    """The `ctx` of one `apply`: what forward saved and marked, and the attributes it set."""

    def __init__(self, fn_cls, needs_input_grad):
        self.fn_cls, self.needs_input_grad = fn_cls, tuple(needs_input_grad)
        self.attrs = {}
        self.saved = TupleVariable([])
        self.non_differentiable = []
        self.in_backward = False

    def python_type(self):
        return self.fn_cls._backward_cls

    def var_getattr(self, frame, name):
        if name in self.attrs:
            return self.attrs[name]
        if name in _CTX_METHODS:
            return MethodVariable(name, self)
        if name in ("saved_tensors", "saved_variables"):
            return self.saved
        if name == "needs_input_grad":
            return const(self.needs_input_grad)
        if name == "materialize_grads":
            return const(True)
        raise Unsupported(f"AttributeError: the autograd.Function ctx has no attribute {name!r}",
                          python_exception=AttributeError(name))

    def var_setattr(self, frame, name, value):
        if name in _CTX_METHODS or name in ("saved_tensors", "needs_input_grad"):
            raise Unsupported(f"assigning ctx.{name}")
        self.attrs[name] = value

    def call_method(self, frame, name, args, kwargs):
        if self.in_backward and name != "set_materialize_grads":
            raise Unsupported(f"ctx.{name}() in backward")
        if name == "save_for_backward":
            if kwargs or not all(isinstance(a, TensorVariable) or is_same(a, const(None)) for a in args):
                raise Unsupported("ctx.save_for_backward() takes tensors or None")
            self.saved = TupleVariable(list(args))
        elif name == "mark_non_differentiable":
            self.non_differentiable.extend(args)
        elif name == "set_materialize_grads" and const_value(args[0] if args else kwargs["value"]):
            pass  # the default: backward gets zeros for outputs that got no gradient
        else:
            raise Unsupported(f"ctx.{name}() in a traced autograd.Function")
        return const(None)


def _apply(frame, args, kwargs):
    """`Function.apply(cls, *args, **kwargs)` (registered for Function.apply's function)."""
    cls_var, args = args[0], list(args[1:])
    cls = const_value(cls_var, "the autograd.Function class")
    if not (isinstance(cls, type) and issubclass(cls, _FUNCTION)):
        raise Unsupported("Function.apply on something that is not an autograd.Function")
    og = frame.og
    forward = _staticmethod(cls, "forward")
    _staticmethod(cls, _backward_name(cls))
    has_setup = inspect.getattr_static(cls, "setup_context") is not _DEFAULT_SETUP_CONTEXT
    inputs = _bind(og, forward, args, kwargs, skip_ctx=not has_setup)
    needs = [og.grad_enabled and isinstance(v, TensorVariable) and v.fake.requires_grad for v in inputs]
    ctx = FunctionCtxVariable(cls, needs)
    if not any(needs):
        return _run_forward(frame, cls_var, ctx, inputs, has_setup, grad_enabled=False, traced=False)
    return _traced_apply(frame, cls_var, cls, ctx, inputs, has_setup)


def _backward_name(cls):
    """"backward" or "vjp", as torch's BackwardCFunction picks the user's backward."""
    overrides_backward, overrides_vjp = cls.backward is not _FUNCTION.backward, cls.vjp is not _FUNCTION.vjp
    if overrides_backward and overrides_vjp:
        raise Unsupported(f"{cls.__qualname__} implements both backward and vjp")
    return "vjp" if overrides_vjp else "backward"


def _staticmethod(cls, name):
    raw = inspect.getattr_static(cls, name)
    if not isinstance(raw, staticmethod):
        raise Unsupported(f"{cls.__qualname__}.{name} is not a staticmethod (a legacy autograd.Function)")
    return raw.__func__


def _bind(og, forward, args, kwargs, skip_ctx):
    """The forward's arguments in order, defaults filled in, as apply binds them."""
    params = list(inspect.signature(forward).parameters.values())[1 if skip_ctx else 0:]
    if kwargs and (skip_ctx or not torch_compat.function_apply_takes_keywords()):
        raise Unsupported("keyword arguments to Function.apply need a setup_context (and torch 2.13+)",
                          python_exception=TypeError("apply() takes no keyword arguments"))
    try:
        bound = inspect.Signature(params).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"Function.apply: {e}", python_exception=e) from e
    bound.apply_defaults()
    if bound.kwargs:
        raise Unsupported("keyword-only arguments of an autograd.Function forward")
    return [v if isinstance(v, Variable) else wrap_const(og, v) for v in bound.args]


def _run_forward(frame, cls_var, ctx, inputs, has_setup, grad_enabled, traced):
    """The user's forward (and setup_context) on `inputs`, in grad mode `grad_enabled`."""
    og = frame.og
    prior = og.grad_enabled
    if not traced:
        og.set_grad_enabled(grad_enabled)
    forward = getattr_var(frame, cls_var, "forward")
    if has_setup:
        out = call(frame, forward, inputs, {})
        call(frame, getattr_var(frame, cls_var, "setup_context"), [ctx, TupleVariable(inputs), out], {})
    else:
        out = call(frame, forward, [ctx] + inputs, {})
    if not traced:
        og.set_grad_enabled(prior)
    return out


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What `_TracedFunction` runs for one traced apply."""
    name: str
    forward: torch.fx.GraphModule    # (*inputs) -> (*tensor outputs, *saved)
    backward: torch.fx.GraphModule   # (*output grads, *saved) -> (*grads of the explicit inputs)
    num_outputs: int
    single: bool                     # forward returned one tensor, not a tuple
    non_differentiable: tuple        # indices of outputs marked non-differentiable
    saved_is_tensor: tuple           # per saved value: a tensor (saved through autograd) or a size
    num_lifted: int                  # inputs the forward reads from outside: no gradient

    def run(self, inputs):
        """-> (tensor outputs, values saved for backward)."""
        results = self.forward(*inputs)
        return results[:self.num_outputs], results[self.num_outputs:]

    def result(self, outputs):
        return outputs[0] if self.single else tuple(outputs)


class _TracedFunction(torch.autograd.Function):
    """The traced forward and backward of a user's autograd.Function, as one autograd node."""

    @staticmethod
    def forward(ctx, spec, *inputs):
        outputs, saved = spec.run(inputs)
        ctx.spec = spec
        ctx.save_for_backward(*(s for s, t in zip(saved, spec.saved_is_tensor) if t))
        ctx.sizes = [s for s, t in zip(saved, spec.saved_is_tensor) if not t]
        if spec.non_differentiable:
            ctx.mark_non_differentiable(*(outputs[k] for k in spec.non_differentiable))
        return spec.result(outputs)

    @staticmethod
    def backward(ctx, *grads):
        spec = ctx.spec
        tensors, sizes = iter(ctx.saved_tensors), iter(ctx.sizes)
        saved = [next(tensors) if t else next(sizes) for t in spec.saved_is_tensor]
        return (None, *spec.backward(*grads, *saved), *[None] * spec.num_lifted)


def _graph_target(spec):
    """The graph node's target: a plain function (fx names it after the user's class). Without a
    gradient to record it runs the forward alone, as apply does; that is also how aot's functional
    trace of an inference graph sees it (functionalization refuses autograd.Functions)."""
    def apply(*inputs):
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            return _TracedFunction.apply(spec, *inputs)
        return spec.result(spec.run(inputs)[0])
    apply.__name__ = apply.__qualname__ = f"{spec.name}_apply"
    return apply


def _traced_apply(frame, cls_var, cls, ctx, inputs, has_setup):
    og = frame.og
    tensor_inputs = [v for v in inputs if isinstance(v, TensorVariable)]
    with og.subgraph(grad_enabled=False) as fwd_raw:
        # one placeholder per tensor argument, even for a tensor passed twice: each gets its own gradient
        inner = [TensorVariable(og.subgraph_input(f"{cls.__name__}_input", v.fake), v.fake)
                 if isinstance(v, TensorVariable) else v for v in inputs]
        own = [v.node for v in inner if isinstance(v, TensorVariable)]
        versions = [v.fake._version for v in tensor_inputs]
        out = _run_forward(frame, cls_var, ctx, inner, has_setup, grad_enabled=False, traced=True)
        if any(v.fake._version != n for v, n in zip(tensor_inputs, versions)):
            raise Unsupported(f"{cls.__qualname__}.forward writes to an input in place (ctx.mark_dirty)")
    single, items = _outputs(cls, out)
    tensor_outs = [v for v in items if isinstance(v, TensorVariable)]
    non_diff = tuple(k for k, v in enumerate(tensor_outs) if any(is_same(v, m) for m in ctx.non_differentiable))

    grads = _trace_backward(frame, cls_var, cls, ctx, items, tensor_outs, inputs)
    backward = subgraphs.close(grads.raw, grads.placeholders, grads.nodes, f"{cls.__name__}Backward")
    saved = backward.lifted  # forward values (or outside nodes) the backward reads
    forward = subgraphs.close(fwd_raw, own,
                              [v.node for v in tensor_outs] + saved, f"{cls.__name__}Forward")
    spec = _Spec(cls.__name__, forward.gm, backward.gm, len(tensor_outs), single, non_diff,
                 tuple(isinstance(n.meta.get("example_value"), torch.Tensor) for n in saved), len(forward.lifted))
    lifted = [subgraphs.outside_variable(n) for n in forward.lifted]
    result = og.call_op("call_function", _graph_target(spec), tensor_inputs + lifted, {})
    results = iter([result] if single else result.items)
    values = [next(results) if isinstance(v, TensorVariable) else v for v in items]
    return values[0] if single else TupleVariable(values)


def _outputs(cls, out):
    """(forward returned one value, its items); items are tensors or constants."""
    single = not (isinstance(out, TupleVariable) and out.cls is tuple)
    items = [out] if single else list(out.items)
    if isinstance(out, ConstantVariable) and isinstance(out.value, tuple):
        single, items = False, [const(v) for v in out.value]
    for v in items:
        if not isinstance(v, (TensorVariable, ConstantVariable)):
            raise Unsupported(f"{cls.__qualname__}.forward returned a {v.python_type().__name__}")
    if not any(isinstance(v, TensorVariable) for v in items):
        raise Unsupported(f"{cls.__qualname__}.forward returned no tensor")
    return single, items


@dataclasses.dataclass
class _Backward:
    raw: torch.fx.Graph
    placeholders: list   # one per tensor output: its incoming gradient
    nodes: list          # per tensor input of apply: its gradient's node, or None


def _trace_backward(frame, cls_var, cls, ctx, items, tensor_outs, inputs):
    og = frame.og
    effects = og.side_effects.count()
    with og.subgraph(grad_enabled=False) as raw:
        placeholders = []
        grad_of = {}
        for k, v in enumerate(tensor_outs):
            with og.fake_mode:
                fake = torch.empty_like(v.fake, memory_format=torch.contiguous_format)
            placeholders.append(og.subgraph_input(f"{cls.__name__}_grad_output", fake))
            grad_of[k] = TensorVariable(placeholders[-1], fake)
        k = iter(range(len(tensor_outs)))
        grad_args = [grad_of[next(k)] if isinstance(v, TensorVariable) else const(None) for v in items]
        ctx.in_backward = True
        result = call(frame, getattr_var(frame, cls_var, _backward_name(cls)), [ctx] + grad_args, {})
    if og.side_effects.count() != effects:
        raise Unsupported(f"{cls.__qualname__}.backward changes Python state (it would run at the wrong time)")
    grads = [result] if not isinstance(result, TupleVariable) else list(result.items)
    if len(grads) < len(inputs) or any(not is_same(g, const(None)) for g in grads[len(inputs):]):
        raise Unsupported(f"{cls.__qualname__}.backward returned {len(grads)} gradients for {len(inputs)} inputs")
    nodes = []
    for v, g in zip(inputs, grads):
        if not isinstance(v, TensorVariable):
            continue
        if isinstance(g, TensorVariable):
            nodes.append(g.node)
        elif is_same(g, const(None)):
            nodes.append(None)
        else:
            raise Unsupported(f"{cls.__qualname__}.backward returned a {g.python_type().__name__} as a gradient")
    return _Backward(raw, placeholders, nodes)


BUILTIN_HANDLERS[torch_compat.function_apply] = _apply
