"""Models of library objects whose behaviour is C code, so capture answers them instead of breaking.

- Process-wide mappings read at capture time (os.environ): a read becomes a constant, and a guard
  reads the same key again on every call, so a changed variable recompiles. Writes are side effects
  outside the graph: they break the graph and run natively.
- The methods of Python's builtin types (dict.get, str.join, frozenset.union, list.__contains__,
  dict.fromkeys, ...), called unbound (`dict.get(d, k)`) or bound to an object capture knows by value:
  on a container capture tracks they run its model (python_builtins.call_method); on a value capture
  knows exactly, a method of the pure table runs natively.
- Pure library functions (re.sub, struct.pack, int.from_bytes, ...; the table _PURE_FUNCTIONS) on
  values capture knows run natively, and so do the methods of the immutable values they return (a
  compiled pattern's sub, a match's group): their results are constants, no graph break.

Imported once by convert.py: each model registers itself in objects.TYPE_MODELS or
python_builtins.BUILTIN_HANDLERS, so the lower modules never import this one.
"""
import binascii
import collections
import enum
import gc
import inspect
import os
import pathlib
import re
import struct
import sys
import traceback
import types
import unicodedata

from kiln.capture import graph_builder, objects, odict_desync, tracebacks
from kiln.capture.objects import TypeModel, const_value, describe, result_var
from kiln.capture.python_builtins import BUILTIN_HANDLERS, call_method
from kiln.capture.sources import AttrSource
from kiln.capture.variables import (BaseIterator, ConstantVariable, DictVariable, GeneratorVariable, IteratorVariable, ListVariable,
                                    DictViewVariable, ObjectVariable, SetVariable, TupleVariable, const, is_constant)
from kiln.exc import Unsupported


# ---- os.environ -----------------------------------------------------------------------------------
class GuardedMappingModel(TypeModel):
    """A mapping the process shares (os.environ), read at capture time and guarded per key read."""
    _WRITES = {"__setitem__", "__delitem__", "pop", "popitem", "setdefault", "update", "clear", "__ior__"}
    _WHOLE = {"keys", "values", "items", "__iter__", "__len__", "copy", "__or__", "__eq__"}

    def attribute(self, frame, var, name):
        if name in ("get", "__getitem__", "__contains__") or name in self._WRITES or name in self._WHOLE:
            return objects.MethodVariable(name, var)
        raise Unsupported(f"attribute {name!r} of {type(var.value).__qualname__}")

    def call_method(self, frame, var, name, args, kwargs):
        mapping = var.value
        if name in self._WRITES:
            raise Unsupported(f"{type(mapping).__qualname__}.{name} changes process state outside the graph")
        if name in self._WHOLE:
            snapshot = dict(mapping)
            g = frame.og.guards
            g.add(None, f"dict({g.const(mapping, 'MAP')}) == {g.const(snapshot, 'SNAP')}",
                  f"the whole of {type(mapping).__qualname__} is unchanged")
            return objects.fold_natively(frame.og, getattr(snapshot, name), args, kwargs)
        if name not in ("get", "__getitem__", "__contains__") or kwargs:
            raise Unsupported(f"{type(mapping).__qualname__}.{name}")
        key = const_value(args[0], f"a {type(mapping).__qualname__} key")
        value = mapping.get(key)
        self._guard(frame.og, mapping, key, value)
        if name == "__contains__":
            return const(value is not None)
        if value is not None:
            return const(value)
        if name == "get":
            return args[1] if len(args) > 1 else const(None)
        raise Unsupported(f"KeyError {key!r}", python_exception=KeyError(key))

    @staticmethod
    def _guard(og, mapping, key, value):
        g = og.guards
        read = f"{g.const(mapping, 'MAP')}.get({key!r})"
        check = f"{read} is None" if value is None else f"{read} == {value!r}"
        g.add(None, check, f"{type(mapping).__qualname__}[{key!r}] is {'unset' if value is None else repr(value)}")


objects.TYPE_MODELS[type(os.environ)] = GuardedMappingModel()


def _guarded_query(fn):
    """A query of process state with no arguments (sys.getrecursionlimit()): answered now, and a
    guard asks it again on every call, so a changed setting recompiles."""
    def handler(frame, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"{fn.__name__} with arguments")
        value = fn()
        g = frame.og.guards
        g.add(None, f"{g.const(fn, 'Q')}() == {value!r}", f"{fn.__module__}.{fn.__name__}() == {value!r}")
        return const(value)
    return handler


for _query in (sys.getrecursionlimit, sys.getdefaultencoding, sys.getfilesystemencoding):
    BUILTIN_HANDLERS[_query] = _guarded_query(_query)


def _with_traceback(frame, args, kwargs):
    """BaseException.with_traceback(tb) on an exception made during capture (unittest's assertRaises
    drops the traceback so): its __traceback__ becomes tb (see tracebacks). Returns the exception."""
    exc, tb = args[0], args[1] if len(args) > 1 else None
    if not (isinstance(exc, ObjectVariable) and exc.source is None and isinstance(exc.value, BaseException)
            and tb is not None):
        raise Unsupported("with_traceback on an exception that exists outside the capture")
    tracebacks.set_traceback(frame.og, exc.value, tb)
    exc.value.__traceback__ = None
    return exc


BUILTIN_HANDLERS[BaseException.with_traceback] = _with_traceback


def _clear_frames(frame, args, kwargs):
    """traceback.clear_frames(tb) (unittest's assertRaises calls it) on a traceback capture made: its
    frames are capture's, which compiled code never has; clearing their locals (eager drops what
    finished frames hold) has nothing to do. Another traceback's frames are not capture's to clear."""
    tb = args[0] if len(args) == 1 and not kwargs else None
    if not (isinstance(tb, (tracebacks.TracebackVariable, tracebacks.UnknownTraceback)) or
            isinstance(tb, ConstantVariable) and tb.value is None):
        raise Unsupported("traceback.clear_frames of a traceback that exists outside the capture",
                          kind="unsupported_call")
    return ConstantVariable(None)


BUILTIN_HANDLERS[traceback.clear_frames] = _clear_frames


def _fspath(frame, args, kwargs):
    """os.fspath: a str/bytes or a pathlib path capture knows by value runs natively; another object's
    own Python __fspath__ is followed (a path made in the frame)."""
    path = args[0] if args else kwargs.get("path")
    known = isinstance(path, ConstantVariable) or isinstance(path, ObjectVariable) and not path.opaque and \
        isinstance(path.value, pathlib.PurePath)
    if known:
        return _run_natively(frame, os.fspath, "os.fspath", [path], {})
    if isinstance(inspect.getattr_static(path.python_type(), "__fspath__", None), types.FunctionType):
        return objects.call(frame, objects.getattr_var(frame, path, "__fspath__"), [], {})
    raise Unsupported(f"os.fspath of {describe(path)}")


def _enum_member(frame, cls, args, kwargs):
    """`SomeEnum(value)`: the member with that value (Enum's lookup, _missing_ included), run natively on
    a constant value; members are fixed objects."""
    if len(args) != 1 or kwargs or not isinstance(args[0], ConstantVariable):
        raise Unsupported(f"constructing {cls.__qualname__} from values capture does not know")
    return objects.fold_natively(frame.og, cls, args, {})


def _path(cls):
    """pathlib paths of constant parts: immutable values, made natively (no file system access)."""
    def construct(frame, args, kwargs):
        if kwargs or not all(isinstance(a, ConstantVariable) or isinstance(a, ObjectVariable) and not a.opaque
                             and isinstance(a.value, pathlib.PurePath) for a in args):
            raise Unsupported(f"{cls.__name__} of values capture does not know")
        return _run_natively(frame, cls, cls.__name__, args, {})
    return construct


class PurePathModel(TypeModel):
    """A pathlib path known by value is an immutable value: its operators (`/`), properties and the
    methods of PurePath (no file system access) run natively; Path's I/O methods break the graph."""
    protocols = True

    def attribute(self, frame, path, name):
        raw = inspect.getattr_static(pathlib.PurePath, name, None)
        if raw is None or name.startswith("_") and name not in ("__fspath__", "__str__", "__class__"):
            raise Unsupported(f"attribute {name!r} of a path (not a pure path operation)")
        if isinstance(raw, types.FunctionType) or callable(raw) and not isinstance(raw, type):
            return objects.MethodVariable(name, path)
        return _run_natively(frame, lambda: getattr(path.value, name), f"path.{name}", [], {})

    def call_method(self, frame, path, name, args, kwargs):
        if inspect.getattr_static(pathlib.PurePath, name, None) is None:
            raise Unsupported(f"Path.{name} (file system access)")
        return _run_natively(frame, getattr(path.value, name), f"path.{name}", args, kwargs)

    def operator(self, frame, op, args):
        if all(isinstance(a, ConstantVariable) or isinstance(a, ObjectVariable) and not a.opaque for a in args):
            return _run_natively(frame, op, op.__name__, args, {})
        return None


BUILTIN_HANDLERS[os.fspath] = _fspath


def _fold_compile_calls(compile_fn):
    """kiln.compile(fn, ...) called inside a compiled frame: made natively; calling what it returns
    follows `fn` into this frame's graph (as torch.compile inside torch.compile does)."""
    BUILTIN_HANDLERS[compile_fn] = lambda frame, args, kwargs: objects.fold_natively(frame.og, compile_fn, args, kwargs)


# kiln.api sits above capture and imports it, so capture finds `kiln.compile` where the package put it
# (the package's __init__ loads kiln.api before any capture module) instead of importing it back
_fold_compile_calls(sys.modules["kiln.api"].compile)
BUILTIN_HANDLERS[sys.intern] = lambda frame, args, kwargs: objects.fold_natively(frame.og, sys.intern, args, kwargs)
for _cls in (pathlib.PurePath, pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.Path, type(pathlib.Path())):
    objects.CONSTRUCTORS[_cls] = _path(_cls)
    objects.TYPE_MODELS[_cls] = PurePathModel()
objects.CONSTRUCTORS[enum.EnumMeta] = _enum_member


# ---- methods of builtin types ---------------------------------------------------------------------
_IMMUTABLE = (str, bytes, tuple, int, float, complex, frozenset, range, bool)
# methods that neither change their receiver nor hand out something that does (iterators, views)
_PURE = {
    list: {"index", "count", "copy", "__getitem__", "__len__", "__contains__", "__add__", "__mul__", "__rmul__",
           "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__repr__", "__sizeof__"},
    dict: {"get", "copy", "__getitem__", "__len__", "__contains__", "__or__", "__eq__", "__ne__", "__repr__",
           "fromkeys"},
    set: {"copy", "union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
          "isdisjoint", "__contains__", "__len__", "__or__", "__and__", "__sub__", "__xor__", "__eq__", "__ne__",
          "__lt__", "__le__", "__gt__", "__ge__", "__repr__"},
}
_PURE[types.MappingProxyType] = {"get", "keys", "values", "items", "copy", "__getitem__", "__contains__", "__len__",
                                  "__or__", "__eq__", "__ne__", "__repr__"}
_MODELLED = (list, dict, set, frozenset, tuple, str, bytes, int, float, collections.OrderedDict,
             collections.defaultdict, types.MappingProxyType)
_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)


def _is_pure(cls, name):
    for klass in cls.__mro__:
        if klass in _IMMUTABLE:
            return name not in ("__iter__", "__reversed__")
        if klass in _PURE:
            return name in _PURE[klass]
    return False


def _native_arg(frame, v):
    """The Python value of an argument to a builtin method run natively: constants, containers of them,
    and iterators, which the method consumes as CPython would."""
    if isinstance(v, BaseIterator):  # (a generator, map, zip, a list iterator, ...)
        return iter([_native_arg(frame, i) for i in objects.unpack_iterable(frame, v)])
    return const_value(v, "an argument of a builtin method run natively")


def call_builtin_method(frame, cls, name, recv, args, kwargs):
    """`cls.name(recv, *args, **kwargs)` for a builtin type `cls`."""
    if odict_desync.bypasses_order(cls, recv, name):
        return odict_desync.bypass(frame, recv, name, args, kwargs)
    if isinstance(recv, odict_desync.DesyncedOrderedDict):
        return odict_desync.call_unbound(frame, cls, recv, name, args, kwargs)
    if cls is dict and isinstance(recv, DictVariable):
        recv = objects.dicts_own_receiver(recv, name)
    if isinstance(recv, (ListVariable, TupleVariable, DictVariable, SetVariable)) and name != "fromkeys":
        return call_method(frame, recv, name, args, kwargs)
    view = objects.readonly_dict_view(frame, recv, getattr(cls, name))  # an existing dict (subclass) read
    if view is not None:
        return call_method(frame, view, name, args, kwargs)
    known = isinstance(recv, ConstantVariable) or isinstance(recv, ObjectVariable) and not recv.opaque
    if known and _is_pure(cls, name):
        return _run_natively(frame, getattr(recv.value, name), f"{cls.__name__}.{name}", args, kwargs)
    raise Unsupported(f"{cls.__name__}.{name} on {describe(recv)}")


def _run_natively(frame, bound, what, args, kwargs):
    try:
        native = [_native_arg(frame, a) for a in args]
        native_kw = {k: _native_arg(frame, v) for k, v in kwargs.items()}
        return result_var(frame.og, bound(*native, **native_kw))
    except Unsupported:
        raise
    except Exception as e:
        raise Unsupported(f"{what} raised {type(e).__name__}: {e}", python_exception=e) from e


def _unbound(cls, name):
    def handler(frame, args, kwargs):
        if not args:
            raise Unsupported(f"{cls.__name__}.{name}() without its receiver")
        return call_builtin_method(frame, cls, name, args[0], list(args[1:]), kwargs)
    return handler


def _fromkeys(cls):
    """`cls.fromkeys(iterable, value=None)`: every key maps to the same value (Variable)."""
    keywords = {"value"} if issubclass(cls, collections.OrderedDict) else set()  # OrderedDict.fromkeys(it, value=)

    def handler(frame, args, kwargs):
        if not 1 <= len(args) + len(kwargs) <= 2 or not args or set(kwargs) - keywords:  # CPython's words
            e = TypeError(f"fromkeys expected at least 1 argument, got {len(args)}" if not args else
                          f"fromkeys expected at most 2 arguments, got {len(args) + len(kwargs)}"
                          if not set(kwargs) - keywords else f"{cls.__name__}.fromkeys() takes no keyword arguments")
            raise Unsupported(f"TypeError: {e}", python_exception=e)
        keys = objects.unpack_iterable(frame, args[0])
        value = args[1] if len(args) > 1 else kwargs.get("value", const(None))
        d = DictVariable({objects.dict_key(k): value for k in keys}, cls=cls)
        if cls is collections.defaultdict:
            d.default_factory = const(None)
        return d
    return handler


def _register_builtin_methods():
    for cls in _MODELLED:
        for name, raw in vars(cls).items():
            if name in ("__new__", "__init__", "__init_subclass__", "__subclasshook__", "__getattribute__",
                        "__setattr__", "__delattr__", "__class_getitem__"):
                continue
            if isinstance(raw, types.ClassMethodDescriptorType) and name == "fromkeys":
                BUILTIN_HANDLERS[getattr(cls, name)] = _fromkeys(cls)
            elif isinstance(raw, _DESCRIPTORS) and not isinstance(raw, types.ClassMethodDescriptorType):
                BUILTIN_HANDLERS.setdefault(raw, _unbound(cls, name))
    for cls in (collections.OrderedDict, collections.defaultdict, collections.Counter):
        BUILTIN_HANDLERS[cls.fromkeys] = _fromkeys(cls) if cls is not collections.Counter else _counter_fromkeys
    for cls in (dict, collections.OrderedDict):  # `Sub.fromkeys(...)`: the C classmethod bound to a subclass
        BUILTIN_HANDLERS[vars(cls)["fromkeys"]] = _subclass_fromkeys


def _subclass_fromkeys(frame, args, kwargs):
    """dict.fromkeys bound to a user subclass, as CPython's dict_fromkeys does it for one: `cls()`, then
    `d[k] = value` per key (the subclass's own __init__ and __setitem__ run)."""
    cls_var = args[0]
    cls = const_value(cls_var, "the class of fromkeys")
    if cls in (dict, collections.OrderedDict, collections.defaultdict) or kwargs or not 2 <= len(args) <= 3:
        base = next(k for k in cls.__mro__ if k in (collections.OrderedDict, collections.defaultdict, dict))
        return _fromkeys(base)(frame, list(args[1:]), kwargs)  # (wrong arguments: its TypeError)
    d = objects.call(frame, cls_var, [], {})
    value = args[2] if len(args) > 2 else const(None)
    for k in objects.unpack_iterable(frame, args[1]):
        objects.setitem(frame, d, k, value)
    return d


def _counter_fromkeys(frame, args, kwargs):
    raise Unsupported("Counter.fromkeys is not implemented", python_exception=NotImplementedError())


_register_builtin_methods()


class BoundBuiltinMethodModel(TypeModel):
    """A method of a builtin type bound to a value (`memo.get`, `'-'.join`), called: the unbound method
    on its receiver."""

    def call(self, frame, var, args, kwargs):
        fn = var.value
        recv = getattr(fn, "__self__", None)
        cls = next((c for c in type(recv).__mro__ if c in _MODELLED), None)
        if cls is None or isinstance(recv, (type, types.ModuleType)) or not hasattr(cls, fn.__name__):
            if isinstance(recv, _IMMUTABLE) or is_constant(recv):  # of an immutable value (Size.numel, Pattern.sub)
                return _run_natively(frame, fn, fn.__name__, args, kwargs)
            return super().call(frame, var, args, kwargs)
        source = objects.AttrSource(var.source, "__self__") if var.source is not None else None
        recv_var = frame.og.wrap(recv, source, guard=source is not None)
        return call_builtin_method(frame, cls, fn.__name__, recv_var, list(args), kwargs)


# ---- pure library functions -----------------------------------------------------------------------
# Their result depends only on their arguments, and they change nothing the program can see (re's cache
# of compiled patterns is invisible): not the ones that hand out iterators (re.finditer).
_PURE_FUNCTIONS = (re.compile, re.sub, re.subn, re.match, re.fullmatch, re.search, re.split, re.findall, re.escape,
                   struct.pack, struct.unpack, struct.unpack_from, struct.calcsize, unicodedata.normalize,
                   unicodedata.category, unicodedata.name, unicodedata.lookup, unicodedata.east_asian_width,
                   binascii.hexlify, binascii.unhexlify, int.from_bytes, float.fromhex,
                   bytes.fromhex, str.maketrans, bytes.maketrans)


def _pure_function(fn):
    name = f"{getattr(fn, '__module__', None) or type(fn.__self__).__name__}.{fn.__name__}"
    return lambda frame, args, kwargs: _run_natively(frame, fn, name, args, kwargs)


BUILTIN_HANDLERS.update({fn: _pure_function(fn) for fn in _PURE_FUNCTIONS})
objects.TYPE_MODELS[types.BuiltinMethodType] = BoundBuiltinMethodModel()
objects.TYPE_MODELS[type(re.compile("").sub)] = BoundBuiltinMethodModel()  # `builtin_method`: a C method that
# receives its defining class (METH_METHOD), a subclass of the above
objects.TYPE_MODELS[types.MethodWrapperType] = BoundBuiltinMethodModel()  # (frozenset().__init__, 1 .__add__)


def _wrap_dict_view(og, view, source, guard):
    """An existing dict_keys / dict_values / dict_items (an argument): a live view of its dict, read
    through the view's read-only `mapping` (guarded on its keys as a dict would be)."""
    if source is None:
        return ObjectVariable(view, None)
    if guard:
        og.guards.type_match(source, view)
    if any(isinstance(m, collections.OrderedDict) for m in gc.get_referents(view.mapping)):  # (the proxied dict)
        return ObjectVariable(view, source, opaque=True)  # dict's view of an OrderedDict's storage order: not modelled
    mapping = og.wrap(view.mapping, AttrSource(source, "mapping"), guard)
    if not isinstance(mapping, DictVariable):  # (keys capture cannot hold exactly: known by type only)
        return ObjectVariable(view, source, opaque=True)
    return DictViewVariable(mapping, _VIEW_KINDS[type(view)], source)


_VIEW_KINDS = {type({}.keys()): "keys", type({}.values()): "values", type({}.items()): "items"}
for _view_type in _VIEW_KINDS:
    graph_builder.VALUE_WRAPPERS[_view_type] = _wrap_dict_view
