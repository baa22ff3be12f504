"""Grad-mode objects beyond `with`: `torch.no_grad()(fn)` and the other decorator forms run torch's own
Python decorator code (_DecoratorContextManager.__call__) over capture's model of the mode, so the
wrapped function enters the mode on every call, as in eager; torch.inference_mode() is a grad-mode block
too. Registers its models in objects."""
import contextlib
import inspect
import types
import warnings

import torch

from kiln.capture import glue, graph_builder, objects
from kiln.capture.objects import TypeModel, call, const_value
from kiln.capture.python_builtins import BUILTIN_HANDLERS
from kiln.capture.variables import ConstantVariable, GradModeVariable, ListVariable, MethodVariable, const
from kiln.exc import Unsupported


class GradModeModel(TypeModel):
    def call(self, frame, mode, args, kwargs):
        return call(frame, self.attribute(frame, mode, "__call__"), args, kwargs)

    def attribute(self, frame, mode, name):
        if name in ("__enter__", "__exit__"):
            raise Unsupported("explicit __enter__/__exit__ calls")
        if name == "__class__":
            return frame.og.wrap(mode.cls, None, guard=False)
        if name == "mode" and mode.cls is torch.inference_mode:
            return const(not mode.enabled)
        if name == "mode" and mode.cls is torch.set_grad_enabled:
            return const(mode.enabled)
        if name == "prev" and mode.cls is torch.set_grad_enabled:
            return const(mode.prior)
        raw = inspect.getattr_static(mode.cls, name, None)
        if isinstance(raw, types.FunctionType):  # clone, __call__: torch's Python code, run over the model
            return MethodVariable(raw, mode)
        raise Unsupported(f"attribute {name!r} of {mode.cls.__qualname__}")


objects.VARIABLE_MODELS[GradModeVariable] = GradModeModel()


def _grad_mode_object(cls, state):
    """A grad-mode object in the state it has in the frame, made without its __init__ (which would
    switch the mode again, for set_grad_enabled)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def _rebuild_grad_mode(g, mode):
    """A grad-mode object that lives past a graph break (made before it, entered after it). Its state
    is what torch's own code would have stored: set_grad_enabled's `prev` and `mode` at construction,
    no_grad's and enable_grad's `prev` when entered (False until then)."""
    if mode.source is not None:  # the object itself (its `prev` is replayed as a side effect)
        return mode.source.expr(g.ctx)
    if mode.cls is torch.set_grad_enabled:
        state = {"prev": mode.prior, "mode": mode.enabled}
    elif mode.cls in (torch.no_grad, torch.enable_grad):
        state = {"prev": bool(mode.entered_from)}
    else:
        raise Unsupported(f"cannot rebuild a {mode.cls.__qualname__} object after a graph break")
    return f"{g.const(_grad_mode_object, 'GRADMODE')}({g.const(mode.cls, 'CLS')}, {state!r})"


glue.REBUILDERS[GradModeVariable] = _rebuild_grad_mode


def _wrap_grad_mode(og, value, source, guard):
    """A grad-mode object from outside the frame (one a resume function is handed after a break):
    modelled by its state, which is guarded, so a new object in the same state runs the same entry."""
    names = ("prev", "mode") if type(value) is torch.set_grad_enabled else ("prev",)  # (enable_grad: prev once entered)
    state = {name: getattr(value, name, None) for name in names}
    if guard and source is not None:
        og.guards.type_match(source, value)
        for name, v in state.items():
            check = f"v.{name} is {v!r}" if hasattr(value, name) else f"not hasattr(v, {name!r})"
            og.guards.add(source, check, f"{source!r}: {check}")
    if type(value) is torch.set_grad_enabled:
        mode = GradModeVariable(value.mode, torch.set_grad_enabled, value.prev, source, value)
    else:
        mode = GradModeVariable(type(value) is torch.enable_grad, type(value), None, source, value)
    mode.entered_from = state["prev"]
    return mode


for _cls in (torch.set_grad_enabled, torch.no_grad, torch.enable_grad):
    graph_builder.VALUE_WRAPPERS[_cls] = _wrap_grad_mode


def _inference_mode(frame, args, kwargs):
    """torch.inference_mode(mode): in the graph, a block with grad mode `not mode` (as c10's
    InferenceMode sets it: inference_mode(False) turns grad on). Tensors made in it are not inference
    tensors afterwards, as with torch.compile's aot backends. `torch.inference_mode` without a call (decorating `fn` directly) applies the default."""
    mode = args[0] if args else kwargs.get("mode", const(True))
    if not (isinstance(mode, ConstantVariable) and isinstance(mode.value, bool)):
        return call(frame, GradModeModel().attribute(frame, GradModeVariable(False, torch.inference_mode), "__call__"),
                    [mode], {})
    return GradModeVariable(not mode.value, torch.inference_mode)


def _grad_mode(cls):
    """torch.no_grad() / enable_grad(); `torch.no_grad(fn)` (no call) decorates fn, as torch's
    _NoParamDecoratorContextManager.__new__ does."""
    def construct(frame, args, kwargs):
        mode = GradModeVariable(cls is torch.enable_grad, cls)
        if args:
            return call(frame, GradModeModel().attribute(frame, mode, "__call__"), list(args), {})
        return mode
    return construct


def _set_grad_enabled_now(frame, args, kwargs):
    """torch._C._set_grad_enabled(b) (a user context manager's __enter__/__exit__, set_grad_enabled's
    decorator): switches grad mode in the graph, as set_grad_enabled does."""
    frame.og.set_grad_enabled(bool(const_value(args[0] if args else kwargs["enabled"], "grad mode")))
    return const(None)


def _catch_warnings(frame, args, kwargs):
    """warnings.catch_warnings(record=..., ...): the ops in a graph warn (if at all) when capture runs
    them, not when the graph does, and a warnings call inside the block is a graph break; so in the
    graph the block is a contextlib.nullcontext whose `as` value is what entering gives: a new, empty
    list with record=True, else None (as torch.compile treats it)."""
    bound = inspect.signature(warnings.catch_warnings).bind(*args, **kwargs)
    record = bool(const_value(bound.arguments.get("record", const(False)), "catch_warnings(record=...)"))
    entered = ListVariable([]) if record else const(None)
    return call(frame, frame.og.wrap(contextlib.nullcontext, None, guard=False), [entered], {})


objects.CONSTRUCTORS[warnings.catch_warnings] = _catch_warnings
objects.CONSTRUCTORS[torch.inference_mode] = _inference_mode
objects.CONSTRUCTORS[torch.no_grad] = _grad_mode(torch.no_grad)
objects.CONSTRUCTORS[torch.enable_grad] = _grad_mode(torch.enable_grad)
BUILTIN_HANDLERS[torch._C._set_grad_enabled] = _set_grad_enabled_now
