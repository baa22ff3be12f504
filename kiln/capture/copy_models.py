"""copy.copy and copy.deepcopy over Variables.

Containers and objects made in the frame are copied symbolically (a deep copy keeps the sharing
between its parts, as copy's memo does); an existing plain object is copied from its __dict__, whose
keys and values the guards pin; atomic values (numbers, strings, functions, classes, modules) are their
own copies; a tensor's deep copy is a clone. Anything else (custom __copy__/__reduce__ in C, modules,
tensors that require grad) breaks the graph and runs natively.
"""
import copy
import types

import torch

from kiln.capture import objects
from kiln.capture.objects import call, describe, python_dunder
from kiln.capture.python_builtins import BUILTIN_HANDLERS
from kiln.capture.sources import AttrSource, ItemSource
from kiln.capture.variables import (ConstantVariable, DequeVariable, DictVariable, FreshObjectVariable,
                                    FunctionVariable, ListVariable, MethodVariable, ObjectVariable, PartialVariable,
                                    SetVariable, TensorVariable, TupleVariable, const)
from kiln.exc import Unsupported

_ATOMIC_TYPES = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type(None), int, float,
                 bool, complex, str, bytes, range, slice, type(Ellipsis), type(NotImplemented), property,
                 torch.dtype, torch.device)
# hooks a class can define to take over copying; capture follows them only when they are Python code
_COPY_HOOKS = ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__",
               "__getnewargs__", "__getnewargs_ex__")


def _copy(frame, args, kwargs):
    return Copier(frame, deep=False).copy(args[0])


def _deepcopy(frame, args, kwargs):
    if len(args) > 1 and not objects.is_same(args[1], const(None)) or kwargs.get("memo") is not None:
        raise Unsupported("copy.deepcopy with a memo of the caller's")
    return Copier(frame, deep=True).copy(args[0])


class Copier:
    def __init__(self, frame, deep):
        self.frame, self.deep, self.memo = frame, deep, {}

    def copy(self, v):
        if id(v) in self.memo:
            return self.memo[id(v)]
        result = self._copy(v)
        self.memo[id(v)] = result
        return result

    def item(self, v):
        """A part of the value being copied: copied too when deep, else shared."""
        return self.copy(v) if self.deep else v

    def _copy(self, v):
        if isinstance(v, (ConstantVariable, FunctionVariable, MethodVariable)):
            return v  # immutable, or a function: its own copy
        if isinstance(v, TensorVariable):
            return self._tensor(v)
        if isinstance(v, (ListVariable, DictVariable, SetVariable, TupleVariable)):
            return self._container(v)
        if isinstance(v, PartialVariable):
            p = PartialVariable(self.item(v.func), [self.item(a) for a in v.args], self._dict(v.keywords))
            p.attrs = self._dict(v.attrs)
            return p
        if isinstance(v, FreshObjectVariable):
            return self._object(v, v.cls, v.attrs)
        if isinstance(v, ObjectVariable):
            return self._existing(v)
        raise Unsupported(f"copy of {describe(v)}")

    def _tensor(self, v):
        if not self.deep:
            raise Unsupported("copy.copy of a tensor (it would share the tensor's storage)")
        if v.fake.requires_grad:
            raise Unsupported("copy.deepcopy of a tensor that requires grad")
        return self.frame.og.call_op("call_method", "clone", [v], {})

    def _dict(self, d):
        out = DictVariable({}, cls=d.cls)
        self.memo[id(d)] = out  # before the items, so a dict holding itself stays one
        out.items = {k: self.item(val) for k, val in d.items.items()}
        if hasattr(d, "default_factory"):
            out.default_factory = self.item(d.default_factory)
        return out

    def _container(self, v):
        cls = v.python_type()
        if cls.__module__ != "builtins" and cls.__module__ != "collections" and \
                any(python_dunder(cls, hook) for hook in _COPY_HOOKS):
            raise Unsupported(f"copy of a {cls.__qualname__} with its own copy hooks")
        if isinstance(v, TupleVariable):
            items = [self.item(i) for i in v.items]
            if not self.deep or all(a is b for a, b in zip(items, v.items)):
                return v  # a tuple of the same items is the tuple itself, as copy returns it
            return TupleVariable(items, cls=v.cls) if v.cls is not tuple else objects.make_tuple(items)
        if isinstance(v, DictVariable):
            out = self._dict(v)
        elif isinstance(v, SetVariable):
            out = SetVariable([(k, self.item(var)) for k, var in v.vars.items()], keys=set(v.keys))
        elif isinstance(v, DequeVariable):
            out = DequeVariable([], maxlen=v.maxlen)
            self.memo[id(v)] = out
            out.items = [self.item(i) for i in v.items]
        else:
            out = ListVariable([], cls=v.cls)
            self.memo[id(v)] = out
            out.items = [self.item(i) for i in v.items]
        out.attrs = {k: self.item(a) for k, a in v.attrs.items()}
        return out

    def _object(self, v, cls, attrs):
        """A copy of an instance of a plain Python class (its own __copy__/__deepcopy__ when written in
        Python): a new object of the class with the (copied) attributes."""
        hook = "__deepcopy__" if self.deep else "__copy__"
        if python_dunder(cls, hook):
            memo = [DictVariable({})] if self.deep else []
            return call(self.frame, objects.getattr_var(self.frame, v, hook), memo, {})
        if any(python_dunder(cls, h) for h in _COPY_HOOKS) or "__slots__" in vars(cls) or \
                cls.__new__ is not object.__new__ or not isinstance(getattr(cls, "__dict__", None), types.MappingProxyType):
            raise Unsupported(f"copy of a {cls.__qualname__} (its class customizes copying or construction)")
        out = FreshObjectVariable(cls)
        self.memo[id(v)] = out
        out.attrs = {k: self.item(a) for k, a in attrs.items()}
        return out

    def _existing(self, v):
        value = v.value
        if isinstance(value, _ATOMIC_TYPES) or isinstance(value, type):
            return v
        if isinstance(value, torch.nn.Module):
            raise Unsupported(f"copy of module {type(value).__qualname__} inside compiled code")
        if v.source is None or type(value).__module__ == "builtins" or not isinstance(getattr(value, "__dict__", None), dict):
            raise Unsupported(f"copy of {describe(v)}")
        og, src = self.frame.og, v.source
        state = value.__dict__
        state_src = AttrSource(src, "__dict__")
        og.guards.keys_match(state_src, state)
        attrs = {k: og.wrap(val, ItemSource(state_src, k)) for k, val in state.items()}
        return self._object(v, type(value), attrs)


BUILTIN_HANDLERS[copy.copy] = _copy
BUILTIN_HANDLERS[copy.deepcopy] = _deepcopy
