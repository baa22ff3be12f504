"""Methods of Python containers and constants, and the builtins capture knows (len, isinstance,
zip, sorted, ...): each one is written over Variables, so no Python value is guessed."""
import collections
import functools
import inspect
import itertools
import math
import operator
import types

import torch

from kiln.capture import data_scalars, odict_order
from kiln.capture.objects import (BUILTIN_HANDLERS, CONTAINER_METHODS, VARIABLE_MODELS, apply_operator, call,
                                  call_method, const_value, delattr_var, describe, dict_key, fold_natively, get_iter,
                                  get_reversed, getattr_var, getitem, is_same, iter_next, key_var, make_tuple,
                                  mapping_items, model_of, new_set, python_dunder, python_special, set_add, set_key,
                                  set_update, setattr_var, setitem, truth, unpack_iterable)
from kiln.capture.variables import (BaseIterator, CellVariable, ConstantVariable, DictVariable, DictViewVariable,
                                    EnumerateIterator, FilterIterator, MapIterator, ZipIterator, FreshObjectVariable,
                                    FunctionVariable, GeneratorVariable, IteratorVariable,
                                    ListVariable, MethodVariable, ObjectVariable, PartialVariable,
                                    SequenceIterator, SetVariable, SuperVariable, SymNodeVariable, TensorVariable,
                                    TupleVariable, const)
from kiln.exc import Unsupported


# ---- methods of Python containers and constants -------------------------------------------------
_SET_MUTATORS = {"pop", "difference_update", "intersection_update", "symmetric_difference_update"}


def _frozen(s):
    return issubclass(s.cls, frozenset)


def _set_method(frame, s, name, args, kwargs):
    """A set method: add/update/discard/remove/clear item by item; any other runs natively on the real
    key sets (set_key), so its result and iteration order are CPython's own. `s` may be an instance of
    a set/frozenset subclass: these are the base's own methods (an override ran before this)."""
    og = frame.og
    if name == "__init__":  # set.__init__ refills the set; a frozenset's is object's (no change)
        if not _frozen(s):
            if kwargs:
                e = TypeError("set() takes no keyword arguments")
                raise Unsupported(f"TypeError: {e}", python_exception=e)
            s.clear()
            for a in args:
                set_update(frame, s, a)
            og.side_effects.mark_mutated(s)
        return const(None)
    if name in ("add", "update", "discard", "remove", "clear"):
        if _frozen(s):
            raise Unsupported(f"AttributeError: frozenset has no attribute {name!r}",
                              python_exception=AttributeError(name))
        if name == "add":
            set_add(s, [args[0]])
        elif name == "update":
            for a in args:
                set_update(frame, s, a)
        elif name == "clear":
            s.clear()
        else:
            key = set_key(args[0])
            if name == "remove" and key not in s.keys:
                raise Unsupported(f"KeyError {key!r}", python_exception=KeyError(key))
            s.discard(key)
        og.side_effects.mark_mutated(s)
        return const(None)
    method = getattr(frozenset if _frozen(s) else set, name, None)
    if method is None or getattr(set, name, None) is None or kwargs or name in ("__iter__", "__reversed__", "__init__", "__new__"):
        raise Unsupported(f"set.{name}")
    if _frozen(s) and name in _SET_MUTATORS:
        raise Unsupported(f"AttributeError: frozenset has no attribute {name!r}", python_exception=AttributeError(name))
    by_key = dict(s.vars)
    native_args = [_set_keys(frame, a, by_key) if name != "__contains__" else set_key(a) for a in args]
    try:
        result = getattr(set, name)(s.keys, *native_args)  # (capture's own table is a set either way)
    except KeyError as e:
        raise Unsupported(f"set.{name} raised KeyError", python_exception=e) from e
    if name in _SET_MUTATORS or result is s.keys:  # (an in-place operator returns the set itself)
        s.vars = {k: by_key[k] for k in s.keys}
        og.side_effects.mark_mutated(s)
        return by_key[result] if name == "pop" else s if result is s.keys else const(None)
    if isinstance(result, (set, frozenset)):
        out = SetVariable([(k, by_key[k]) for k in result], keys=set(result))
        out.cls = frozenset if _frozen(s) else set  # a subclass's operations make plain sets/frozensets
        return out
    return const(result)


def _set_keys(frame, v, by_key):
    """A set operation's argument as real keys; records the Variable of each new key in `by_key`."""
    if isinstance(v, SetVariable):
        for k, var in v.vars.items():
            by_key.setdefault(k, var)
        return v.keys
    if isinstance(v, ConstantVariable) and isinstance(v.value, (set, frozenset)):
        for k in v.value:
            by_key.setdefault(k, const(k))
        return v.value  # the set itself: CPython merges a set's table, which can order the result differently
    items = unpack_iterable(frame, v)
    keys = []
    for item in items:
        k = set_key(item)
        by_key.setdefault(k, item)
        keys.append(k)
    return keys


def call_list_method(frame, lst, name, args, kwargs):
    """The builtin list method `name` on a ListVariable (of list or a subclass)."""
    og = frame.og
    mutating = name in ("append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort", "__setitem__",
                        "__delitem__", "__init__")
    if name == "append":
        lst.items.append(args[0])
        result = const(None)
    elif name == "extend":
        if isinstance(args[0], (ListVariable, TupleVariable)):
            lst.items.extend(list(args[0].items))  # CPython copies a list or tuple first (`y.extend(y)`)
        else:  # any other iterable item by item, so each item sees the list as it grows
            it = get_iter(frame, args[0])
            while (item := iter_next(frame, it)) is not None:
                lst.items.append(item)
        result = const(None)
    elif name == "insert":
        lst.items.insert(const_value(args[0]), args[1])
        result = const(None)
    elif name == "pop":
        if not lst.items:
            raise Unsupported("pop from empty list")
        result = lst.items.pop(const_value(args[0]) if args else -1)
    elif name == "clear":
        lst.items.clear()
        result = const(None)
    elif name == "reverse":
        lst.items.reverse()
        result = const(None)
    elif name == "copy":
        return ListVariable(lst.items)
    elif name == "__init__":  # list.__init__ on an existing list refills it
        lst.items[:] = unpack_iterable(frame, args[0]) if args else []
        result = const(None)
    elif name in ("index", "count", "__len__", "__contains__"):
        return fold_natively(og, getattr(const_value(lst), name), args, kwargs)
    elif name == "__getitem__":
        return getitem(frame, lst, args[0], builtin=True)
    elif name == "__setitem__":
        setitem(frame, lst, args[0], args[1])
        return const(None)
    elif name == "__delitem__":
        k = const_value(args[0])
        del lst.items[k]
        result = const(None)
    elif name == "remove":
        for i, item in enumerate(lst.items):
            if is_same(item, args[0]) or (isinstance(item, ConstantVariable) and isinstance(args[0], ConstantVariable)
                                          and item.value == args[0].value):
                del lst.items[i]
                break
        else:
            raise Unsupported("list.remove(x): x not in list")
        result = const(None)
    elif name == "sort":
        key = kwargs.get("key")
        if key is not None and not is_same(key, const(None)):
            values = [const_value(call(frame, key, [item], {}), "sort key") for item in lst.items]
        else:
            values = const_value(lst, "sorting")
        reverse = bool(const_value(kwargs.get("reverse", const(False))))
        order = sorted(range(len(values)), key=lambda i: values[i], reverse=reverse)
        lst.items[:] = [lst.items[i] for i in order]
        result = const(None)
    else:
        raise Unsupported(f"list.{name}")
    if mutating:
        og.side_effects.mark_mutated(lst)
    return result


# dict methods' positional argument counts (CPython's signatures): a call outside them raises
# CPython's TypeError before the method does anything
_DICT_ARITY = {"keys": (0, 0), "values": (0, 0), "items": (0, 0), "clear": (0, 0), "copy": (0, 0), "__len__": (0, 0),
               "popitem": (0, 0), "get": (1, 2), "pop": (1, 2), "setdefault": (1, 2), "__getitem__": (1, 1),
               "__contains__": (1, 1), "__delitem__": (1, 1), "__setitem__": (2, 2), "__eq__": (1, 1),
               "__ne__": (1, 1), "__or__": (1, 1), "__ior__": (1, 1), "update": (0, 1), "__init__": (0, 1),
               "move_to_end": (1, 2)}
_DICT_KEYWORDS = {"update": None, "__init__": None, "popitem": {"last"}, "move_to_end": {"last"}}  # None: any


def check_dict_arguments(d, name, args, kwargs):
    low, high = _DICT_ARITY.get(name, (0, len(args)))
    if name == "popitem" and issubclass(d.cls, collections.OrderedDict):
        high = 1  # OrderedDict.popitem(last=True)
    allowed = _DICT_KEYWORDS.get(name, set())
    bad_keyword = allowed is not None and any(k not in allowed for k in kwargs)
    if low <= len(args) <= high and not bad_keyword:
        return
    n, plural = len(args), (lambda k: "argument" if k == 1 else "arguments")
    if bad_keyword:
        text = f"{name}() got an unexpected keyword argument"
    elif high == 0:
        text = f"{d.cls.__name__}.{name}() takes no arguments ({n} given)"
    elif n < low:
        text = f"{name} expected at least {low} {plural(low)}, got {n}"
    else:
        text = f"{name} expected at most {high} {plural(high)}, got {n}"
    e = TypeError(text)  # CPython's words
    raise Unsupported(f"TypeError: {e}", python_exception=e)


def dict_method(frame, d, name, args, kwargs):
    og = frame.og
    check_dict_arguments(d, name, args, kwargs)
    if name in ("keys", "values", "items"):
        return DictViewVariable(d, name)
    if name in ("get", "__getitem__"):
        k = dict_key(args[0])
        if k in d.items:
            return d.items[k]
        if name == "__getitem__":
            raise Unsupported(f"KeyError {k!r}", python_exception=KeyError(k))
        return args[1] if len(args) > 1 else const(None)
    if name == "__contains__":
        return const(dict_key(args[0]) in d.items)
    if name == "__len__":
        return const(len(d.items))
    if name in ("__eq__", "__ne__"):  # dict's own: NotImplemented for anything but a mapping of its kind
        if not isinstance(args[0], DictVariable):
            return const(NotImplemented)
        return apply_operator(frame, operator.eq if name == "__eq__" else operator.ne, [d, args[0]])
    if name == "__copy__" and issubclass(d.cls, collections.defaultdict):
        name = "copy"  # (defaultdict's __copy__ is its copy: the same factory)
    if name == "copy":  # (a mappingproxy's copy is its mapping's: a dict)
        copied = DictVariable(d.items, cls=dict if d.cls is types.MappingProxyType else d.cls)
        if hasattr(d, "default_factory"):
            copied.default_factory = d.default_factory
        return copied
    if name == "__or__":
        merged = dict_method(frame, d, "copy", [], {}) if d.cls in (dict, collections.OrderedDict,
                                                                      collections.defaultdict) else DictVariable(d.items)
        merged.items.update(mapping_items(frame, args[0]))
        return merged
    if name == "move_to_end" and issubclass(d.cls, collections.OrderedDict):
        k = dict_key(args[0])
        last = const_value(args[1]) if len(args) > 1 else const_value(kwargs.get("last", const(True)))
        if k not in d.items:
            raise Unsupported(f"KeyError {k!r}", python_exception=KeyError(k))
        odict_order.before_reorder(d)  # (the storage keeps its order: dict.popitem(od) no longer takes the last key)
        value = d.items.pop(k)
        d.items = {k: value, **d.items} if not last else {**d.items, k: value}
        og.side_effects.mark_mutated(d)
        return const(None)
    if name in ("__setitem__", "update", "__init__", "__ior__", "pop", "setdefault", "clear", "__delitem__",
                "popitem"):
        if d.cls is types.MappingProxyType:
            raise Unsupported(f"mappingproxy does not support {name}", python_exception=TypeError(name))
        og.side_effects.mark_mutated(d)
        return dict_mutation(frame, d, name, args, kwargs)
    raise Unsupported(f"dict.{name}")


def dict_mutation(frame, d, name, args, kwargs):
    before = set(d.items)
    result = _mutate(frame, d, name, args, kwargs)
    odict_order.after_change(d, before)  # (an OrderedDict's storage order, where it differs)
    return result


def _mutate(frame, d, name, args, kwargs):
    if name == "__setitem__":
        d.items[dict_key(args[0])] = args[1]
        return const(None)
    if name in ("update", "__init__", "__ior__"):  # dict.__init__ on an existing dict updates it
        for a in args:
            d.items.update(mapping_items(frame, a))
        d.items.update(kwargs)
        return d if name == "__ior__" else const(None)
    if name == "pop":
        k = dict_key(args[0])
        if k in d.items:
            return d.items.pop(k)
        if len(args) > 1:
            return args[1]
        raise Unsupported(f"KeyError {k!r}", python_exception=KeyError(k))
    if name == "setdefault":
        k = dict_key(args[0])
        if k not in d.items:
            d.items[k] = args[1] if len(args) > 1 else const(None)
        return d.items[k]
    if name == "clear":
        d.items.clear()
        return const(None)
    if name == "popitem":
        if not d.items:
            raise Unsupported("popitem(): dictionary is empty", python_exception=KeyError("popitem(): dictionary is empty"))
        last = const_value(args[0] if args else kwargs.get("last", const(True)), "popitem(last=)")
        k = next(reversed(d.items)) if last else next(iter(d.items))
        return make_tuple([key_var(k), d.items.pop(k)])
    k = dict_key(args[0])  # __delitem__
    if k not in d.items:
        raise Unsupported(f"KeyError {k!r}", python_exception=KeyError(k))
    del d.items[k]
    return const(None)


# ---- builtins -----------------------------------------------------------------------------------
_MODULE_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict, torch.nn.ParameterList,
                      torch.nn.ParameterDict)


def builtin_len(frame, args, kwargs):
    v = args[0]
    if isinstance(v, TensorVariable):
        if v.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        if isinstance(v.fake.shape[0], torch.SymInt):
            return frame.og.call_op("call_function", len, [v], {})
        return const(v.fake.shape[0])
    if isinstance(v, ConstantVariable):
        return const(len(v.value))
    if isinstance(v, BaseIterator):
        msg = f"object of type '{v.python_type().__name__}' has no len()"
        raise Unsupported(msg, python_exception=TypeError(msg))
    if (model := model_of(v)) is not None:
        return model.call_method(frame, v, "__len__", [], {})
    if not isinstance(getattr(v, "value", None), _MODULE_CONTAINERS) and \
            (own := python_special(frame, v, "__len__")) is not None:  # (those: their children, guarded)
        return call(frame, own, [], {})
    if isinstance(v, SetVariable):
        return const(len(v.keys))  # (not through its items: their order is not read)
    return const(len(unpack_iterable(frame, v)))


def _b_isinstance(frame, args, kwargs):
    obj, classes = args
    cls = const_value(classes, "isinstance class")
    if isinstance(obj, (ObjectVariable, ConstantVariable)):
        return const(isinstance(obj.value, cls))
    return const(issubclass(obj.python_type(), cls))


def _b_type(frame, args, kwargs):
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments")
    return frame.og.wrap(args[0].python_type(), None, guard=False)


def _b_getattr(frame, args, kwargs):
    name = const_value(args[1], "getattr name")
    try:
        return getattr_var(frame, args[0], name)
    except Unsupported as e:
        if len(args) > 2 and "AttributeError" in str(e):
            return args[2]
        raise


def _b_hasattr(frame, args, kwargs):
    name = const_value(args[1], "hasattr name")
    try:
        getattr_var(frame, args[0], name)
        return const(True)
    except Unsupported as e:
        if isinstance(e.python_exception, AttributeError) or "AttributeError" in str(e) or "has no attribute" in str(e):
            return const(False)
        raise


def _b_setattr(frame, args, kwargs):
    setattr_var(frame, args[0], const_value(args[1]), args[2])
    return const(None)


def _b_vars(frame, args, kwargs):
    if kwargs or len(args) > 1:  # CPython's own argument errors, which the program may catch
        e = TypeError("vars() takes no keyword arguments" if kwargs else
                      f"vars expected at most 1 argument, got {len(args)}")
        raise Unsupported(str(e), python_exception=e)
    if not args:
        raise Unsupported("vars() of the calling frame")
    try:
        return getattr_var(frame, args[0], "__dict__")
    except Unsupported as u:
        if not isinstance(u.python_exception, AttributeError):
            raise
        e = TypeError("vars() argument must have __dict__ attribute")  # (not the AttributeError)
        raise Unsupported(str(e), python_exception=e) from u


def _b_delattr(frame, args, kwargs):
    delattr_var(frame, args[0], const_value(args[1], "delattr name"))
    return const(None)


def _iterable_builtin(fn):
    def handler(frame, args, kwargs):
        if fn is enumerate:
            start = const_value(kwargs.get("start", const(0))) if not args[1:] else const_value(args[1])
            return EnumerateIterator(get_iter(frame, args[0]), start)
        if fn is zip:
            return ZipIterator([get_iter(frame, a) for a in args], bool(const_value(kwargs.get("strict", const(False)))))
        if fn is reversed:
            return get_reversed(frame, args[0])
        if fn is iter:
            if len(args) != 1:
                raise Unsupported("iter(callable, sentinel)")
            return get_iter(frame, args[0])
        lists = [unpack_iterable(frame, a) for a in args]
        if fn is list:
            return ListVariable(lists[0] if lists else [])
        if fn is tuple:
            return make_tuple(lists[0] if lists else [])
        raise AssertionError(fn)
    return handler


def _b_next(frame, args, kwargs):
    it = args[0]
    if not isinstance(it, BaseIterator):
        raise Unsupported(f"next() on {describe(it)}")
    if isinstance(it, GeneratorVariable) and len(args) == 1:
        return call_method(frame, it, "__next__", [], {})  # its StopIteration carries the return value
    item = iter_next(frame, it)
    if item is None:
        if len(args) > 1:
            return args[1]
        raise Unsupported("StopIteration", python_exception=StopIteration())
    return item


def build_dict(frame, args, kwargs):
    items = mapping_items(frame, args[0]) if args else {}
    items.update(kwargs)
    return DictVariable(items)


def _b_ordered_dict(frame, args, kwargs):
    d = build_dict(frame, args, kwargs)
    d.cls = collections.OrderedDict
    return d


def _b_defaultdict(frame, args, kwargs):
    d = build_dict(frame, args[1:], kwargs)
    d.cls = collections.defaultdict
    d.default_factory = args[0] if args else const(None)
    return d


def _b_set(frame, args, kwargs):
    out = new_set([])
    if args:
        set_update(frame, out, args[0])
    return out


def _b_frozenset(frame, args, kwargs):
    """frozenset(iterable): a constant when its items are, else a SetVariable that cannot change."""
    try:
        return fold_natively(frame.og, frozenset, args, kwargs)
    except Unsupported:
        out = _b_set(frame, args, kwargs)
        out.cls = frozenset
        return out


def _text_of(fn, dunder):
    """str() / repr(): a class's own Python __str__ / __repr__ runs; constants fold natively."""
    def handler(frame, args, kwargs):
        v = args[0] if args else None
        if len(args) == 1 and not kwargs and (render := getattr(VARIABLE_MODELS.get(type(v)), "text", None)):
            return const(render(frame, v, fn))
        if isinstance(v, (ObjectVariable, FreshObjectVariable)) and not kwargs and len(args) == 1:
            cls = v.python_type()
            for name in (dunder, "__repr__"):
                if python_dunder(cls, name):
                    return call(frame, getattr_var(frame, v, name), [], {})
        return fold_natively(frame.og, fn, args, kwargs)
    return handler


def _extremum(fn):
    """min()/max() over tensors, as torch.compile traces them: torch.minimum/maximum of two tensors,
    clamp of a tensor against a number (the same values eager's comparisons pick)."""
    pairwise, bound = (torch.maximum, "min") if fn is max else (torch.minimum, "max")

    def pick(frame, a, b):
        if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
            return frame.og.call_op("call_function", pairwise, [a, b], {})
        t, n = (a, b) if isinstance(a, TensorVariable) else (b, a)
        return frame.og.call_op("call_function", torch.clamp, [t], {bound: n})

    def handler(frame, args, kwargs, fold=_b_minmax(fn)):
        items = unpack_iterable(frame, args[0]) if len(args) == 1 else list(args)
        if kwargs or not any(isinstance(i, TensorVariable) for i in items) or \
                not all(isinstance(i, TensorVariable) or isinstance(i, ConstantVariable) and
                        type(i.value) in (int, float, bool) for i in items):
            return fold(frame, [ListVariable(items)], kwargs)  # (the items: an iterator is consumed)
        result = items[0]
        for item in items[1:]:
            result = pick(frame, result, item)
        return result
    return handler


def _reducing(fn):
    def handler(frame, args, kwargs):
        if fn in (any, all):  # stops at the first deciding item, as CPython does (later items never run)
            it = get_iter(frame, args[0])
            while (item := iter_next(frame, it)) is not None:
                if truth(frame, item) == (fn is any):
                    return const(fn is any)
            return const(fn is all)
        items = unpack_iterable(frame, args[0])
        result = args[1] if len(args) > 1 else kwargs.get("start", const(0))
        for i in items:
            result = apply_operator(frame, operator.add, [result, i])
        return result
    return handler


def _b_super(frame, args, kwargs):
    if args:
        cls = const_value(args[0])
        return SuperVariable(cls, args[1])
    cell = frame.cells.get("__class__")
    if cell is None:
        raise Unsupported("super() outside a method")
    cls = frame.load_cell(cell, "__class__").value
    first = frame.code.co_varnames[0]
    obj = frame.cells[first].contents if first in frame.cells and isinstance(frame.cells[first], CellVariable) \
        else frame.load_local(first)
    return SuperVariable(cls, obj)


def _b_print(frame, args, kwargs):
    raise Unsupported("print() has side effects outside the graph", kind="print_or_log")


def _b_callable(frame, args, kwargs):
    v = args[0]
    if isinstance(v, (FunctionVariable, MethodVariable, PartialVariable)):
        return const(True)
    if isinstance(v, (ObjectVariable, ConstantVariable)):
        return const(callable(v.value))
    return const(False)


def _b_id(frame, args, kwargs):
    v = args[0]
    if isinstance(v, ObjectVariable):
        if v.source is not None:  # the next call may pass another object of the same type
            frame.og.guards.id_match(v.source, v.value)
        return const(id(v.value))
    raise Unsupported("id() of a value made during capture")


def _b_abs(frame, args, kwargs):
    return apply_operator(frame, operator.abs, args)


def _b_minmax(fn):
    sym = torch.sym_max if fn is max else torch.sym_min

    def handler(frame, args, kwargs):
        items = unpack_iterable(frame, args[0]) if len(args) == 1 else list(args)
        if any(isinstance(i, TensorVariable) for i in items):
            raise Unsupported(f"{fn.__name__}() over tensors needs their data", kind="data_dependent")
        if not kwargs and _same_number_kind(items):  # max(0, n - k) of a dynamic size: no specialization
            result = items[0]
            for item in items[1:]:
                result = frame.og.call_op("call_function", sym, [result, item], {})
            return result
        return fold_natively(frame.og, fn, [ListVariable(items)], kwargs)
    return handler


def _same_number_kind(items):
    """Symbolic numbers, all ints (bools count) or all floats: torch.sym_max/sym_min of them gives what
    max()/min() give (with ints and floats mixed, sym_max returns a float where max keeps an int)."""
    kinds = {_NUMBER_KINDS.get(type(i.value)) if isinstance(i, (SymNodeVariable, ConstantVariable)) else None
             for i in items}
    return len(items) > 1 and len(kinds) == 1 and None not in kinds and \
        any(isinstance(i, SymNodeVariable) for i in items)


_NUMBER_KINDS = {int: int, bool: int, torch.SymInt: int, float: float, torch.SymFloat: float}


def _b_slice(frame, args, kwargs):
    """slice(stop) / slice(start, stop[, step]) as the BUILD_SLICE opcode makes it: with a symbolic
    bound it stays symbolic (a tensor indexed by it keeps the size dynamic), not pinned to its value."""
    parts = [const(None), *args] if len(args) == 1 else list(args)
    if kwargs or not 2 <= len(parts) <= 3 or \
            not all(p.is_constant() or isinstance(p, SymNodeVariable) for p in parts):
        return fold_natively(frame.og, slice, args, kwargs)  # (and CPython's TypeError for wrong arguments)
    return frame.make_slice(parts)


def _b_isinstance_sub(frame, args, kwargs):
    return const(issubclass(const_value(args[0]), const_value(args[1])))


def _b_numeric(fn):
    def handler(frame, args, kwargs):
        if args and isinstance(args[0], TensorVariable):
            raise Unsupported(f"{fn.__name__}(tensor) needs the tensor's data", kind="data_dependent")
        if fn is bool and len(args) == 1 and not kwargs and model_of(args[0]) is not None:
            return const(truth(frame, args[0]))  # (a modelled kind's truth: its model's)
        return fold_natively(frame.og, fn, args, kwargs)
    return handler


def _b_length_hint(frame, args, kwargs):
    """operator.length_hint(obj, default=0) as PyObject_LengthHint: a list/tuple/range/str iterator's
    is what it has left; a class's own Python __length_hint__ runs (unless it has a __len__), its
    NotImplemented giving the default. The rest folds natively."""
    default = args[1] if len(args) == 2 else const(0)
    if kwargs or not 1 <= len(args) <= 2 or not (isinstance(default, ConstantVariable) and type(default.value) is int):
        return fold_natively(frame.og, operator.length_hint, args, kwargs)  # (and CPython's TypeError)
    obj = args[0]
    if isinstance(obj, SequenceIterator):
        return const(_left_in(obj))
    hint = python_special(frame, obj, "__length_hint__")
    if hint is None or python_special(frame, obj, "__len__") is not None:
        return fold_natively(frame.og, operator.length_hint, args, kwargs)
    value = const_value(call(frame, hint, [], {}), "a __length_hint__ result")
    if value is NotImplemented:
        return default
    if not isinstance(value, int):
        e = TypeError(f"__length_hint__ must be an integer, not {type(value).__name__}")  # CPython's words
    elif value < 0:
        e = ValueError("__length_hint__() should return >= 0")
    else:
        return const(value)
    raise Unsupported(f"{type(e).__name__}: {e}", python_exception=e)


def _left_in(it):
    """How many items a sequence iterator has left, as its C __length_hint__ says: none once exhausted
    (it dropped the sequence) or once the sequence shrank below its position."""
    if it.done:
        return 0
    seq = it.seq.value if isinstance(it.seq, ConstantVariable) else it.seq.items
    if it.reverse:
        return it.index + 1 if len(seq) >= it.index + 1 else 0
    return max(len(seq) - it.index, 0)


def _number_of(fn):
    """int() / float() of a symbolic size or number stays symbolic (torch.sym_int truncates as int()
    does; int of a SymInt is itself): `int(h // 8 * 2 - 1)` must not pin the image size."""
    fallback = _b_numeric(fn)

    def handler(frame, args, kwargs):
        v = args[0] if len(args) == 1 and not kwargs else None
        if not isinstance(v, SymNodeVariable) or isinstance(v.value, torch.SymBool):
            return fallback(frame, args, kwargs)
        if fn is int and isinstance(v.value, torch.SymInt):
            return v
        return frame.og.call_op("call_function", torch.sym_int if fn is int else torch.sym_float, [v], {})
    return handler


def _b_map(frame, args, kwargs):
    if kwargs:  # (map(strict=...) is Python 3.14's)
        raise Unsupported("map() takes no keyword arguments", python_exception=TypeError(
            "map() takes no keyword arguments"))
    if len(args) < 2:
        raise Unsupported("map() must have at least two arguments", python_exception=TypeError(
            "map() must have at least two arguments."))
    return MapIterator(args[0], [get_iter(frame, a) for a in args[1:]])


def _b_filter(frame, args, kwargs):
    return FilterIterator(args[0], get_iter(frame, args[1]))


def _b_reduce(frame, args, kwargs):
    fn, items = args[0], unpack_iterable(frame, args[1])
    if len(args) > 2:
        items = [args[2]] + items
    if not items:
        raise Unsupported("reduce() of an empty sequence")
    acc = items[0]
    for item in items[1:]:
        acc = call(frame, fn, [acc, item], {})
    return acc


def _b_native_query(fn):
    """Pure standard-library queries about known objects (inspect.signature): answered natively."""
    def handler(frame, args, kwargs):
        return fold_natively(frame.og, fn, args, kwargs)
    return handler


def _b_itertools(fn, iterables):
    """An itertools function over finite iterables, run natively on positions into a pool of the items'
    Variables, so tensors and other symbolic items pass through untouched. `iterables`: which positional
    arguments are iterables ("all", or a count from the front); the other arguments are constants."""
    def handler(frame, args, kwargs):
        n = len(args) if iterables == "all" else iterables
        pool = []

        def positions(items):
            pool.extend(items)
            return range(len(pool) - len(items), len(pool))
        native_args = [list(positions(unpack_iterable(frame, a))) for a in args[:n]] + \
            [const_value(a, f"{fn.__name__} argument") for a in args[n:]]
        native_kwargs = {}
        for k, v in kwargs.items():
            native_kwargs[k] = positions([v])[0] if k == "fillvalue" else const_value(v, f"{fn.__name__} {k}")
        if fn is itertools.zip_longest and "fillvalue" not in native_kwargs:
            native_kwargs["fillvalue"] = positions([const(None)])[0]

        def back(x):
            return make_tuple([back(i) for i in x]) if isinstance(x, tuple) else pool[x]
        try:
            return IteratorVariable([back(x) for x in fn(*native_args, **native_kwargs)])
        except (TypeError, ValueError) as e:
            raise Unsupported(f"{fn.__name__} raised {type(e).__name__}: {e}", python_exception=e) from e
    return handler


def _b_accumulate(frame, args, kwargs):
    items = unpack_iterable(frame, args[0])
    fn = args[1] if len(args) > 1 else kwargs.get("func")
    acc = [kwargs["initial"]] if kwargs.get("initial") is not None else []
    for item in items:
        if not acc:
            acc.append(item)
        elif fn is None or is_same(fn, const(None)):
            acc.append(apply_operator(frame, operator.add, [acc[-1], item]))
        else:
            acc.append(call(frame, fn, [acc[-1], item], {}))
    return IteratorVariable(acc)


_ITERTOOLS = {itertools.chain: "all", itertools.product: "all", itertools.zip_longest: "all",
              itertools.combinations: 1, itertools.permutations: 1, itertools.combinations_with_replacement: 1,
              itertools.pairwise: 1}


def _b_chain_from_iterable(frame, args, kwargs):
    return IteratorVariable([i for it in unpack_iterable(frame, args[0]) for i in unpack_iterable(frame, it)])


def _b_prod(frame, args, kwargs):
    """math.prod over Variables, so a product of symbolic sizes stays symbolic instead of pinned."""
    result = kwargs.get("start", const(1))
    for item in unpack_iterable(frame, args[0]):
        result = apply_operator(frame, operator.mul, [result, item])
    return result


def _b_sorted(frame, args, kwargs):
    items = unpack_iterable(frame, args[0])
    lst = ListVariable(items)
    call_list_method(frame, lst, "sort", [], kwargs)
    return lst


def _torch_check(error_type):
    """torch._check(cond, message=None) and its kin: answered at capture, no graph break. A
    constant cond is known now; a symbolic one (a size) is decided now and the shape guards keep
    the answer. A failing check raises what eager raises (the message callable is called then, as
    eager calls it)."""
    def handler(frame, args, kwargs):
        args = list(args)
        kind = const_value(args.pop(0)) if error_type is None else error_type  # torch._check_with(type, ...)
        cond = args[0] if args else kwargs.get("cond")
        message = args[1] if len(args) > 1 else kwargs.get("message", const(None))
        if not isinstance(cond, (ConstantVariable, SymNodeVariable)) or \
                isinstance(cond, ConstantVariable) and not isinstance(cond.value, bool):
            raise Unsupported(f"torch check of {describe(cond)}")
        if data_scalars.is_data_dependent(cond) and data_scalars.known_truth(cond.value) is None:
            data_scalars.check_in_graph(frame, cond, frame.where())
            return const(None)
        if truth(frame, cond):
            return const(None)
        text = "Expected cond to be True, but got False. (Could this error message be improved? If so, please " \
               "report an enhancement request to PyTorch.)"
        if not is_same(message, const(None)):
            text = const_value(call(frame, message, [], {}), "a torch check's message")
        raise Unsupported(f"torch check failed: {text}", python_exception=kind(text))
    return handler


def _torch_check_is_size(frame, args, kwargs):
    """torch._check_is_size(n, message=None, *, max=None): torch._check(0 <= n [<= max]); a number
    read out of tensor data is also advised to be a size, as eager's does."""
    n = args[0] if args else kwargs["i"]
    checks = [apply_operator(frame, operator.ge, [n, const(0)])]
    if kwargs.get("max") is not None:
        checks.append(apply_operator(frame, operator.le, [n, kwargs["max"]]))
    for cond in checks:
        _torch_check(RuntimeError)(frame, [cond, *args[1:2]], {})
    if data_scalars.is_data_dependent(n):
        from torch.fx.experimental.symbolic_shapes import _advise_is_size
        _advise_is_size(n.value)
    return const(None)


_TORCH_CHECKS = {torch._check: RuntimeError, torch._check_index: IndexError, torch._check_value: ValueError,
                 torch._check_type: TypeError, torch._check_not_implemented: NotImplementedError,
                 torch._check_with: None}


BUILTIN_HANDLERS.update({
    len: builtin_len, isinstance: _b_isinstance, issubclass: _b_isinstance_sub, type: _b_type, getattr: _b_getattr,
    hasattr: _b_hasattr, setattr: _b_setattr, delattr: _b_delattr, vars: _b_vars, enumerate: _iterable_builtin(enumerate), zip: _iterable_builtin(zip),
    reversed: _iterable_builtin(reversed), iter: _iterable_builtin(iter), list: _iterable_builtin(list),
    tuple: _iterable_builtin(tuple), next: _b_next, dict: build_dict, set: _b_set, frozenset: _b_frozenset,
    sum: _reducing(sum), any: _reducing(any), all: _reducing(all), min: _extremum(min), max: _extremum(max),
    super: _b_super, print: _b_print, callable: _b_callable, id: _b_id, abs: _b_abs,
    int: _number_of(int), float: _number_of(float), bool: _b_numeric(bool), str: _text_of(str, "__str__"),
    round: _b_numeric(round), range: _b_numeric(range), slice: _b_slice, divmod: _b_numeric(divmod),
    pow: _b_numeric(pow), repr: _text_of(repr, "__repr__"), format: _b_numeric(format), chr: _b_numeric(chr),
    ord: _b_numeric(ord), hash: _b_numeric(hash), map: _b_map, filter: _b_filter, sorted: _b_sorted,
    complex: _b_numeric(complex), functools.reduce: _b_reduce, collections.OrderedDict: _b_ordered_dict,
    collections.defaultdict: _b_defaultdict, inspect.signature: _b_native_query(inspect.signature),
    inspect.isclass: _b_native_query(inspect.isclass), inspect.isfunction: _b_native_query(inspect.isfunction),
    inspect.ismethod: _b_native_query(inspect.ismethod),
    tuple.__new__: lambda frame, args, kwargs: TupleVariable(unpack_iterable(frame, args[1]),
                                                             cls=const_value(args[0])),
    object.__new__: lambda frame, args, kwargs: FreshObjectVariable(const_value(args[0])),
    math.floor: _b_numeric(math.floor), math.ceil: _b_numeric(math.ceil), math.sqrt: _b_numeric(math.sqrt),
    math.prod: _b_prod, operator.length_hint: _b_length_hint,
    **{fn: _b_itertools(fn, which) for fn, which in _ITERTOOLS.items()},
    itertools.chain.from_iterable: _b_chain_from_iterable, itertools.accumulate: _b_accumulate,
    **{fn: _torch_check(error) for fn, error in _TORCH_CHECKS.items()}, torch._check_is_size: _torch_check_is_size,
})

CONTAINER_METHODS.update({ListVariable: call_list_method, DictVariable: dict_method, SetVariable: _set_method})
