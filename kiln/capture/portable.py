"""Values described so that another process finds them again, for the capture cache on disk.

`describe(obj)` gives a JSON-able description of a constant a generated guard or glue function
refers to; `rebuild(desc)` gives the object in this process, or raises Stale when there is none that
is the same. Functions and classes are found by module and qualified name and carry a fingerprint
of what capture read through them without a guard of its own (a function's code, defaults and
closure; a class's attributes along its MRO): a function whose source changed, or a class given
another method, is Stale, never reused. Anything else (a live instance, a cell, a code object, a
weak reference) is Unportable: the entry stays in this process only.

`graph_to_json` / `graph_from_json` carry a captured torch.fx graph (nodes, their targets by name,
literal arguments, and the placeholders' `source` and `module_state`); graphs with symbolic sizes,
submodules or attributes are Unportable.
"""
import ctypes
import hashlib
import importlib
import json
import operator
import os
import sys
import types
import weakref

import torch
import torch.fx

from kiln.capture import class_watch

try:  # a graph module whose Python code torch.fx generates on first use, not when it is made
    from torch.fx._lazy_graph_module import _LazyGraphModule as _GraphModuleOnDemand
except ImportError:  # (a torch without it generates the code at once)
    _GraphModuleOnDemand = torch.fx.GraphModule

_LITERALS = (type(None), bool, int, str)
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format, torch.device)


class Unportable(Exception):
    """The value exists in this process only: its entry is not kept on disk."""


class Stale(Exception):
    """A described value is not found, or is not the same, in this process: the entry is not used."""


# ---- fingerprints ---------------------------------------------------------------------------------
def code_fingerprint(code):
    """sha256 of what a code object does: bytecode, constants (nested code by fingerprint), names,
    variables, closure layout, flags, exception table. Not its file or line numbers."""
    found = _CODE_PRINTS.get(id(code))
    if found is not None and found[0]() is code:
        return found[1]
    parts = [code.co_code.hex(), code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
             code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
             code.co_qualname, code.co_exceptiontable.hex(), [_const_key(c) for c in code.co_consts]]
    fingerprint = _sha(parts)
    key = id(code)
    _CODE_PRINTS[key] = (weakref.ref(code, lambda _, key=key: _forget_print(key)), fingerprint)
    return fingerprint


# id(code) -> (weak reference to code, its fingerprint). A stored entry's guards call code_fingerprint
# on every call (a loaded entry checks code by fingerprint): a dict by id and a weak reference's call
# cost ~0.1 us where WeakKeyDictionary.get, a Python method that makes a weak reference, cost ~1 us.
_CODE_PRINTS = {}


def _forget_print(key):
    found = _CODE_PRINTS.get(key)
    if found is not None and found[0]() is None:  # (not a newer code object that took the same id)
        del _CODE_PRINTS[key]


def _const_key(c):
    if isinstance(c, types.CodeType):
        return ["code", code_fingerprint(c)]
    if isinstance(c, (tuple, frozenset)):
        items = [_const_key(v) for v in c]
        return [type(c).__name__, sorted(items, key=repr) if isinstance(c, frozenset) else items]
    return [type(c).__name__, repr(c)]


def function_fingerprint(fn):
    """The code, defaults and closure of a Python function (what inlining it reads unguarded)."""
    return _sha(_function_parts(fn))


def _function_parts(fn):
    cells = [_shallow_key(c.cell_contents) if _cell_full(c) else ["empty"] for c in fn.__closure__ or ()]
    defaults = [_shallow_key(v) for v in fn.__defaults__ or ()]
    kwdefaults = sorted([k, _shallow_key(v)] for k, v in (fn.__kwdefaults__ or {}).items())
    return [code_fingerprint(fn.__code__), defaults, kwdefaults, cells]


def class_fingerprint(cls):
    """The attributes of `cls` and each class in its MRO that can change (methods by fingerprint,
    numbers and strings by value, other objects by type: reading one guards it on its own)."""
    return _sha([_own_fingerprint(k) for k in cls.__mro__])


def _own_fingerprint(k):
    """One class's part of class_fingerprint, remembered under its version tag (a new tag whenever
    the class or a base changes), so a base shared by many classes (nn.Module) is hashed once."""
    if not class_watch.can_change(k):
        return [k.__module__, k.__qualname__, None]
    tag = class_watch.current_tag(k)
    found = _CLASS_PRINTS.get(k)
    if found is not None and tag is not None and found[0] == tag:
        return found[1]
    fingerprint = _sha([k.__module__, k.__qualname__, sorted([name, _attribute_key(v)] for name, v in vars(k).items()
                                                             if name not in _DERIVED_CLASS_ATTRIBUTES)])
    if tag is not None:
        _CLASS_PRINTS[k] = (tag, fingerprint)
    return fingerprint


# caches Python sets on a class when it first needs them (copyreg's, when an instance is first copied or
# pickled): whether they are there yet says nothing about what the class does
_DERIVED_CLASS_ATTRIBUTES = frozenset({"__slotnames__"})
_CLASS_PRINTS = weakref.WeakKeyDictionary()  # class -> (its version tag, fingerprint of its own attributes)


def _attribute_key(v):
    if isinstance(v, types.FunctionType):
        return ["fn", _function_parts(v)]  # (hashed once with the whole class)
    if isinstance(v, (staticmethod, classmethod)):
        return [type(v).__name__, _attribute_key(v.__func__)]
    if isinstance(v, property):
        return ["property", [_attribute_key(f) for f in (v.fget, v.fset, v.fdel)]]
    return _shallow_key(v)


def _shallow_key(v):
    """Literals by value, functions by fingerprint, classes by name, other objects by type."""
    if isinstance(v, _LITERALS + (float, bytes, complex)) or \
            isinstance(v, tuple) and all(isinstance(x, _LITERALS + (float,)) for x in v):
        return [type(v).__name__, repr(v)]
    if isinstance(v, types.FunctionType):
        return ["fn", v.__module__, v.__qualname__, code_fingerprint(v.__code__)]
    if isinstance(v, type):
        return ["class", v.__module__, v.__qualname__]
    return ["object", type(v).__module__, type(v).__qualname__]


def _cell_full(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def _sha(parts):
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


# ---- values ---------------------------------------------------------------------------------------
def describe(obj, watched_tags):
    """A JSON-able description of `obj`; `watched_tags` maps id(tag reference) -> its class, for the
    version-tag references class_watch puts into guards. Raises Unportable."""
    if isinstance(obj, _LITERALS):
        return ["value", obj]
    if isinstance(obj, (float, complex)):
        return [type(obj).__name__, repr(obj)]  # nan, inf and -0.0 kept apart
    if isinstance(obj, torch.Size):
        return ["size", list(obj)]
    if type(obj) is tuple:
        return ["tuple", [describe(v, watched_tags) for v in obj]]
    if isinstance(obj, _TORCH_CONSTANTS):
        from kiln.compiler.graph_cache import describe_torch_constant
        desc = describe_torch_constant(obj)
        if desc is None:
            raise Unportable(f"{obj!r} is not found in torch under its name")
        return desc
    if isinstance(obj, types.ModuleType):
        if sys.modules.get(obj.__name__) is not obj:
            raise Unportable(f"module {obj.__name__} is not imported under its name")
        return ["module", obj.__name__]
    if type(obj) is dict and _is_module_namespace(obj):
        return ["globals", obj["__name__"]]
    if obj is os.environ:  # (models read settings from it; its entries are guarded one by one)
        return ["environ"]
    if isinstance(obj, class_watch.ClassWatch):
        return ["class_watch", describe(obj.cls(), watched_tags)]
    if isinstance(obj, ctypes.c_uint) and id(obj) in watched_tags:
        return ["class_tag", describe(watched_tags[id(obj)], watched_tags)]
    if isinstance(obj, torch._ops.OpOverload):
        return ["op", obj.name()]
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
                        types.WrapperDescriptorType)):
        module, path = _name_of(obj)
        return ["object", module, path, _fingerprint(obj)]
    raise Unportable(f"a {type(obj).__name__} exists in this process only")


def describe_guard_value(obj, watched_tags):
    """describe() for a guard's constants, which guards only read: a dict of str keys (the keyword
    arguments of a folded call) by value too (a glue's dict is a live object it may write to)."""
    if type(obj) is dict and all(type(k) is str for k in obj) and not _is_module_namespace(obj):
        return ["dict", [[k, describe_guard_value(v, watched_tags)] for k, v in obj.items()]]
    return describe(obj, watched_tags)


def _fingerprint(obj):
    if isinstance(obj, type):
        return class_fingerprint(obj)
    if isinstance(obj, types.FunctionType):
        return function_fingerprint(obj)
    return None


def _is_module_namespace(d):
    module = _module_named(d.get("__name__"))
    return module is not None and module.__dict__ is d


def _module_named(name):
    return sys.modules.get(name) if isinstance(name, str) else None


def _name_of(obj):
    """(module, qualified name) that import back to `obj` itself."""
    owner = getattr(obj, "__objclass__", None)  # a method descriptor: torch.Tensor.add
    if owner is not None and getattr(obj, "__module__", None) is None:
        candidates = [(owner.__module__, f"{owner.__qualname__}.{obj.__name__}")]
    else:
        module = getattr(obj, "__module__", None)
        candidates = [(module, getattr(obj, "__qualname__", None)), (module, getattr(obj, "__name__", None))]
    for module, path in candidates:
        if isinstance(module, str) and isinstance(path, str) and "<" not in path and _resolve(module, path) is obj:
            return module, path
    raise Unportable(f"{obj!r} cannot be found by module and qualified name")


def _resolve(module, path):
    try:
        return operator.attrgetter(path)(importlib.import_module(module))
    except Exception:
        return None


def rebuild(desc):
    """The object `desc` describes, in this process; Stale when it is not there or not the same."""
    kind, *rest = desc
    if kind == "value":
        return rest[0]
    if kind in ("float", "complex"):
        return float(rest[0]) if kind == "float" else complex(rest[0])
    if kind == "size":
        return torch.Size(rest[0])
    if kind == "tuple":
        return tuple(rebuild(d) for d in rest[0])
    if kind == "torch":
        return getattr(torch, rest[0])
    if kind == "device":
        return torch.device(rest[0])
    if kind == "module":
        return _import(rest[0])
    if kind == "globals":
        return _import(rest[0]).__dict__
    if kind == "dict":
        return {k: rebuild(d) for k, d in rest[0]}
    if kind == "environ":
        return os.environ
    if kind == "class_watch":
        return class_watch.ClassWatch(rebuild(rest[0]))
    if kind == "class_tag":
        return class_watch.tag_reference(rebuild(rest[0]))
    if kind == "op":
        from kiln.compiler.graph_cache import op_named
        try:
            return op_named(rest[0])
        except AttributeError:
            raise Stale(f"operator {rest[0]} is gone") from None
    if kind == "object":
        module, path, fingerprint = rest
        obj = _resolve(module, path)
        if obj is None:
            raise Stale(f"{module}.{path} is not there")
        if _fingerprint(obj) != fingerprint:
            raise Stale(f"{module}.{path} changed")
        return obj
    raise Stale(f"unknown description {kind!r}")


def _import(name):
    try:
        return importlib.import_module(name)
    except Exception as e:
        raise Stale(f"module {name} does not import: {e}") from None


# ---- fx graphs ------------------------------------------------------------------------------------
def graph_to_json(gm):
    """The nodes of a captured graph as JSON-able lists."""
    from kiln.compiler import graph_cache
    try:  # with symbolic sizes, each placeholder's description (graph_cache keys the graph by them)
        symbolic = graph_cache.symbolic_inputs(gm)
    except graph_cache.Uncacheable as e:
        raise Unportable(str(e)) from None
    inputs = iter(symbolic or ())
    nodes = []
    for node in gm.graph.nodes:
        if node.op in ("call_module", "get_attr"):
            raise Unportable(f"graph node {node.name} is a {node.op}")
        if not symbolic and _is_symbolic(node.meta.get("example_value")):
            raise Unportable("the graph has sizes read from tensor data")
        target = describe(node.target, {}) if node.op == "call_function" else node.target
        meta = {k: node.meta[k] for k in ("source", "module_state") if k in node.meta}
        if symbolic and node.op == "placeholder":
            meta["kiln_input"] = next(inputs)
        nodes.append([node.op, node.name, target, _args_to_json((node.args, node.kwargs)), meta])
    return nodes


def graph_from_json(nodes):
    graph = torch.fx.Graph()
    made = {}
    for op, name, target, args, meta in nodes:
        target = rebuild(target) if op == "call_function" else target
        a, kw = _args_from_json(args, made)
        node = graph.create_node(op, target, tuple(a), dict(kw), name=name)
        if node.name != name:
            raise Stale(f"graph node {name} came back as {node.name}")
        node.meta.update(meta)
        made[name] = node
    # a graph the compiler finds compiled in its cache is never run as Python: generating its code
    # (torch.fx's recompile) waits until something reads or runs it (graph_cache keys it by its nodes)
    return _GraphModuleOnDemand(torch.nn.Module(), graph)


def _args_to_json(value):
    if isinstance(value, torch.fx.Node):
        return ["node", value.name]
    if type(value) in (tuple, torch.Size) or isinstance(value, list):  # (fx holds its lists as immutable_list)
        return ["list" if isinstance(value, list) else type(value).__name__, [_args_to_json(v) for v in value]]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):  # (and dicts as immutable_dict)
        return ["dict", [[k, _args_to_json(v)] for k, v in value.items()]]
    if isinstance(value, slice):
        return ["slice", _args_to_json((value.start, value.stop, value.step))]
    if value is Ellipsis:
        return ["..."]
    return ["const", describe(value, {})]


def _args_from_json(value, made):
    kind = value[0]
    if kind == "node":
        return made[value[1]]
    if kind in ("tuple", "list", "Size"):
        items = [_args_from_json(v, made) for v in value[1]]
        return {"tuple": tuple, "list": list, "Size": torch.Size}[kind](items)
    if kind == "dict":
        return {k: _args_from_json(v, made) for k, v in value[1]}
    if kind == "slice":
        return slice(*_args_from_json(value[1], made))
    if kind == "...":
        return Ellipsis
    return rebuild(value[1])


def _is_symbolic(value):
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))
    if isinstance(value, (tuple, list)):
        return any(_is_symbolic(v) for v in value)
    return False
