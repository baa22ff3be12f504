"""Function objects as Python sees them: the attributes of functions made in the frame, the bound
methods over them, functools.partial objects made in the frame, and lru_cache / cache wrappers.

An attribute a function type defines (`__call__`, `__get__`, `__eq__`, ...) exists on every function, so
hasattr sees it; one it does not define and the object's __dict__ lacks is an AttributeError that
getattr(f, name, default) and hasattr catch, as in CPython. Registers its models in objects.
"""
import functools
import inspect
import operator
import types

from kiln.capture import glue, objects
from kiln.capture.objects import TypeModel, call, describe, make_tuple
from kiln.capture.python_builtins import BUILTIN_HANDLERS
from kiln.capture.sources import AttrSource
from kiln.capture.variables import (ConstantVariable, DictVariable, FunctionVariable, MethodVariable, ObjectVariable,
                                    PartialVariable, Variable, const)
from kiln.exc import Unsupported


def attribute_error(owner, name):
    return Unsupported(f"AttributeError: {owner} has no attribute {name!r}",
                       python_exception=AttributeError(name))


def type_attribute(frame, var, cls, name):
    """An attribute that `var`'s type `cls` defines: a method bound to `var`, or a plain class value."""
    for klass in cls.__mro__:
        if name in vars(klass):
            raw = vars(klass)[name]
            if isinstance(raw, (types.MethodDescriptorType, types.WrapperDescriptorType, types.FunctionType)):
                return MethodVariable(raw, var)
            if name == "__doc__" or isinstance(raw, (str, int, type(None))):
                return const(raw)
            return frame.og.wrap(raw, None, guard=False)
    raise attribute_error(cls.__name__, name)


# ---- functions made in the frame ------------------------------------------------------------------
_FUNCTION_SLOTS = ("__name__", "__qualname__", "__doc__", "__module__", "__annotations__", "__type_params__")


class FunctionModel(TypeModel):
    def attribute(self, frame, fn, name):
        if name in fn.slots:
            return fn.slots[name]
        if name in fn.attrs.items:
            return fn.attrs.items[name]
        if name == "__dict__":
            return fn.attrs
        value = self._native_attribute(frame, fn, name)
        if value is not None:
            return value
        return type_attribute(frame, fn, types.FunctionType, name)

    @staticmethod
    def _native_attribute(frame, fn, name):
        code = fn.code
        if name == "__name__":
            return const(fn.name.rsplit(".", 1)[-1])
        if name == "__qualname__":
            return const(fn.name)
        if name == "__code__":
            return const(code)
        if name == "__doc__":  # CPython keeps a function's docstring as its first constant (3.11)
            first = code.co_consts[0] if code.co_consts else None
            return const(first if isinstance(first, str) else None)
        if name == "__module__":
            return const(fn.f_globals.get("__name__"))
        if name == "__defaults__":
            return fn.defaults if fn.defaults is not None else const(None)
        if name == "__kwdefaults__":
            return fn.kwdefaults if fn.kwdefaults is not None else const(None)
        if name == "__annotations__":
            fn.slots[name] = DictVariable({})  # made on first read, as CPython does
            return fn.slots[name]
        if name == "__closure__":
            return make_tuple(list(fn.closure)) if fn.closure else const(None)
        if name == "__globals__":
            return ObjectVariable(fn.f_globals)
        if name == "__builtins__":
            builtins = fn.f_globals.get("__builtins__")
            return ObjectVariable(builtins if isinstance(builtins, dict) else vars(builtins))
        if name == "__class__":
            return frame.og.wrap(types.FunctionType, None, guard=False)
        return None

    def set_attribute(self, frame, fn, name, value):
        if name == "__defaults__":
            fn.defaults = None if objects.is_same(value, const(None)) else value
        elif name == "__kwdefaults__":
            fn.kwdefaults = None if objects.is_same(value, const(None)) else value
        elif name in _FUNCTION_SLOTS:
            if name in ("__name__", "__qualname__") and not isinstance(value, ConstantVariable):
                raise Unsupported(f"{name} must be set to a str", python_exception=TypeError(name))
            fn.slots[name] = value
        elif name.startswith("__") and name.endswith("__") and hasattr(types.FunctionType, name):
            raise Unsupported(f"setting {name} of a function")
        else:
            fn.attrs.items[name] = value
        return None


objects.VARIABLE_MODELS[FunctionVariable] = FunctionModel()


class MethodModel(TypeModel):
    """A bound method: __func__ and __self__, the function's own attributes through it."""

    def attribute(self, frame, m, name):
        if name == "__self__":
            return m.obj
        fn = m.fn
        if name == "__func__":
            if isinstance(fn, str):
                raise Unsupported(f"__func__ of a method of {describe(m.obj)}")
            return fn if isinstance(fn, FunctionVariable) else frame.og.wrap(fn, None, guard=False)
        if isinstance(fn, FunctionVariable):
            return objects.getattr_var(frame, fn, name)
        if isinstance(fn, types.FunctionType) and name in ("__name__", "__qualname__", "__doc__", "__module__"):
            return const(getattr(fn, name))
        if isinstance(fn, str) and name in ("__name__", "__qualname__"):  # a method of a list/dict/set Variable
            return const(fn if name == "__name__" else f"{m.obj.python_type().__qualname__}.{fn}")
        if name == "__class__":
            return frame.og.wrap(m.python_type(), None, guard=False)
        return type_attribute(frame, m, types.MethodType, name)


objects.VARIABLE_MODELS[MethodVariable] = MethodModel()


# ---- functools.partial ----------------------------------------------------------------------------
def make_partial(frame, args, kwargs):
    """functools.partial(func, *args, **keywords); a partial of a partial flattens, as CPython's does."""
    if not args:
        raise Unsupported("partial() needs a callable", python_exception=TypeError("partial"))
    func, pre = args[0], list(args[1:])
    if isinstance(func, PartialVariable):
        pre, kwargs = func.args + pre, {**func.keywords.items, **kwargs}
        func = func.func
    elif isinstance(func, ObjectVariable) and type(func.value) is functools.partial:
        inner = func.value
        src = func.source
        pre = [frame.og.wrap(a, objects.ItemSource(AttrSource(src, "args"), i) if src else None)
               for i, a in enumerate(inner.args)] + pre
        kwargs = {**{k: frame.og.wrap(v, objects.ItemSource(AttrSource(src, "keywords"), k) if src else None)
                     for k, v in inner.keywords.items()}, **kwargs}
        func = frame.og.wrap(inner.func, AttrSource(src, "func") if src else None)
    if not objects.truth(frame, BUILTIN_HANDLERS[callable](frame, [func], {})):
        raise Unsupported("the first argument of partial() must be callable",
                          python_exception=TypeError("the first argument must be callable"))
    return PartialVariable(func, pre, DictVariable(kwargs))


class PartialModel(TypeModel):
    def call(self, frame, p, args, kwargs):
        return call(frame, p.func, p.args + list(args), {**p.keywords.items, **kwargs})

    def attribute(self, frame, p, name):
        if name == "func":
            return p.func
        if name == "args":
            return make_tuple(list(p.args))
        if name == "keywords":
            return p.keywords
        if name == "__dict__":
            return p.attrs
        if name in p.attrs.items:
            return p.attrs.items[name]
        if name == "__class__":
            return frame.og.wrap(functools.partial, None, guard=False)
        return type_attribute(frame, p, functools.partial, name)

    def set_attribute(self, frame, p, name, value):
        if name in ("func", "args", "keywords"):
            raise Unsupported(f"readonly attribute {name}", python_exception=AttributeError(name))
        p.attrs.items[name] = value


BUILTIN_HANDLERS[functools.partial] = make_partial
objects.VARIABLE_MODELS[PartialVariable] = PartialModel()


# ---- operator.methodcaller -------------------------------------------------------------------------
class MethodCallerVariable(Variable):
    """operator.methodcaller(name, *args, **kwargs) made in the frame (its arguments may be tensors)."""

    def __init__(self, name, args, kwargs):
        self.name, self.args, self.kwargs = name, args, kwargs

    def python_type(self):
        return operator.methodcaller


def make_methodcaller(frame, args, kwargs):
    if not args or not isinstance(args[0], ConstantVariable) or not isinstance(args[0].value, str):
        raise Unsupported("methodcaller needs a method name", python_exception=TypeError("method name must be a string"))
    return MethodCallerVariable(args[0].value, list(args[1:]), dict(kwargs))


class MethodCallerModel(TypeModel):
    def call(self, frame, mc, args, kwargs):
        if len(args) != 1 or kwargs:
            raise Unsupported("methodcaller takes one argument", python_exception=TypeError("methodcaller"))
        if isinstance(mc, MethodCallerVariable):
            name, pre, kw = mc.name, mc.args, mc.kwargs
        else:  # an existing one: its parts, as pickling sees them
            maker, parts = mc.value.__reduce__()
            kw = {k: objects.wrap_const(frame.og, v) for k, v in getattr(maker, "keywords", {}).items()}
            names = getattr(maker, "args", ()) + parts
            name, pre = names[0], [objects.wrap_const(frame.og, a) for a in names[1:]]
        return call(frame, objects.getattr_var(frame, args[0], name), pre, kw)


def _rebuild_methodcaller(g, mc):
    parts = [repr(mc.name)] + [g.value(a) for a in mc.args] + [f"{k}={g.value(v)}" for k, v in mc.kwargs.items()]
    return f"{g.const(operator.methodcaller, 'MCALLER')}({', '.join(parts)})"


objects.CONSTRUCTORS[operator.methodcaller] = make_methodcaller
objects.VARIABLE_MODELS[MethodCallerVariable] = MethodCallerModel()
objects.TYPE_MODELS[operator.methodcaller] = MethodCallerModel()
glue.REBUILDERS[MethodCallerVariable] = _rebuild_methodcaller


# ---- lru_cache / cache wrappers -------------------------------------------------------------------
class LruCacheModel(TypeModel):
    """A functools.lru_cache / cache wrapper: a call runs the wrapped function inline (as torch.compile
    does); the cache itself is neither read nor filled, which is only visible through its statistics."""

    def call(self, frame, var, args, kwargs):
        wrapped = var.value.__wrapped__
        return call(frame, frame.og.wrap(wrapped, AttrSource(var.source, "__wrapped__") if var.source else None),
                    args, kwargs)

    def call_method(self, frame, var, name, args, kwargs):
        raise Unsupported(f"{name}() of an lru_cache wrapper reads or changes its cache")


objects.TYPE_MODELS[functools._lru_cache_wrapper] = LruCacheModel()



# ---- inspect's predicates -------------------------------------------------------------------------
def _stand_in(v):
    """A real object inspect's predicates answer alike for a Variable: a function with its code (or a
    method of one) for a function made in the frame, a builtin method for one of a C object's, else a
    plain object (what capture's other Variables are: not classes, functions or modules)."""
    fn = v.fn if isinstance(v, MethodVariable) else v
    if isinstance(fn, FunctionVariable) or isinstance(fn, types.FunctionType):
        code = fn.code if isinstance(fn, FunctionVariable) else fn.__code__
        real = types.FunctionType(code, {}, "stand_in", None, tuple(types.CellType() for _ in code.co_freevars) or None)
        return real if fn is v else types.MethodType(real, object())
    if isinstance(v, MethodVariable):
        return [].append
    return object()


def _predicate(test):
    """An inspect predicate answered from a Variable's kind and code flags, never its contents."""
    def handler(frame, args, kwargs):
        v = args[0]
        return const(bool(test(v.value if isinstance(v, (ObjectVariable, ConstantVariable)) else _stand_in(v))))
    return handler


for _name in ("isclass", "isfunction", "ismethod", "isgeneratorfunction", "iscoroutinefunction",
              "isasyncgenfunction", "isbuiltin", "isroutine", "ismodule"):
    BUILTIN_HANDLERS[getattr(inspect, _name)] = _predicate(getattr(inspect, _name))
