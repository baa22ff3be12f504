"""Python semantics over Variables: calls, attributes, items, operators, truth and iteration.

The interpreter calls these for every opcode that touches a value. Anything that cannot be decided
at capture time without guessing raises Unsupported (a graph break, or an error under fullgraph).
"""
import collections
import dataclasses
import functools
import inspect
import math
import operator
import sys
import types

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from kiln.capture import data_scalars, odict_order
from kiln.capture.call_sites import original_code
from kiln.capture.disable import is_disabled_function
from kiln.capture.graph_builder import TENSOR_FACTS, is_library_module, is_scalar_type, to_fake
from kiln.capture.guards import held_weakly
from kiln.capture.sources import AttrSource, ConstSource, GlobalSource, ItemSource
from kiln.config import config
from kiln.capture.tracebacks import set_traceback, traceback_of
from kiln.capture.variables import (AutocastVariable, BaseIterator, CellVariable, ConstantVariable, DataDictVariable,
                                    DictIterator, DictVariable, DictViewVariable, EnumerateIterator, FilterIterator,
                                    MapIterator, ObjectIterator, SequenceIterator, ZipIterator, ExitVariable, FreshObjectVariable, FunctionVariable, GradModeExit,
                                    HandlerVariable, NativeExit,
                                    GeneratorVariable, GradModeVariable, IteratorVariable, ListVariable, MethodVariable,
                                    ObjectVariable, PartialVariable, RealCell, RuntimeFunctionVariable, SetVariable,
                                    SliceVariable, SuperVariable, SymNodeVariable, TensorKey, TensorVariable, TupleVariable, VariableKey,
                                    const, is_constant)
from kiln.exc import Unsupported

# The builtins and library functions capture models (fn -> handler(frame, args, kwargs)): python_builtins
# and the *_models modules register theirs; `call` looks a callee up here before inlining it.
BUILTIN_HANDLERS = {}
# The methods of list/dict/set Variables (class -> fn(frame, obj, name, args, kwargs)), from python_builtins
CONTAINER_METHODS = {}

_STATEFUL_WORDS = ("seed", "set_", "rng", "manual", "deterministic", "synchronize", "empty_cache", "save",
                   "load", "print", "register", "backward", "_log_api_usage")
_MODULE_MOD = torch.nn.modules.module


class TypeModel:
    """How capture handles the existing instances of one library type whose behaviour is C code
    (os.environ, a bound builtin method): calls, attribute reads, method calls, and the protocols
    (`[k]`, `in`, `len`, iteration) as calls of their dunder methods. Modules that model a type register
    it in TYPE_MODELS, so this module never imports them."""

    def call(self, frame, var, args, kwargs):
        raise Unsupported(f"call to {describe(var)} (not Python code kiln can follow)", kind="unsupported_call")

    def attribute(self, frame, var, name):
        return _object_attr(frame, var, name)

    def call_method(self, frame, var, name, args, kwargs):
        raise Unsupported(f"method {name} of {describe(var)} is not modelled")

    def set_attribute(self, frame, var, name, value):
        raise Unsupported(f"setting attribute {name!r} on {describe(var)}")

    def method_attribute(self, frame, var, cls, name):
        """`var.name` on an instance of the C class `cls` whose methods this model runs: its class, or
        the method bound to it (CPython's AttributeError for a name `cls` lacks)."""
        if name == "__class__":
            return frame.og.wrap(cls, None, guard=False)
        if not hasattr(cls, name):
            raise Unsupported(f"AttributeError: {cls.__name__} has no attribute {name!r}",
                              python_exception=AttributeError(name))
        return MethodVariable(name, var)

    protocols = False  # (VARIABLE_MODELS) whether `[k]`, `in`, `len`, iteration and operators come here

    def truth(self, frame, var):
        if hasattr(var.python_type(), "__len__"):
            return truth(frame, self.call_method(frame, var, "__len__", [], {}))
        return True

    def operator(self, frame, op, args):
        """`op(*args)` where an operand is of this model's kind; None: not handled here."""
        return None


TYPE_MODELS = {}  # type of an existing object -> TypeModel
VARIABLE_MODELS = {}  # a Variable class modelled in its own module (function_objects.py) -> TypeModel
MODULE_MODELS = {}  # top-level library module whose callables capture models as a whole ("numpy") -> TypeModel
TENSOR_METHODS = {}  # Tensor method modelled in another module ("numpy") -> handler(frame, t, args, kwargs)
SUBCLASS_CONSTRUCTORS = {}  # builtin base (list) -> handler(frame, cls, args, kwargs) for its subclasses, or None
ITERATOR_STEPS = {}  # an iterator Variable kind defined in its own module -> fn(frame, it) -> next item or None
CONSTRUCTORS = {}  # library class whose construction another module models -> handler(frame, args, kwargs);
# a metaclass (EnumMeta) -> handler(frame, cls, args, kwargs) for every class made with it


def model_of(v):
    """The TypeModel of an existing object's type, or of a Variable kind whose model takes the
    protocols (`[k]`, `in`, `len`, iteration, operators) itself; else None."""
    if isinstance(v, ObjectVariable):
        return TYPE_MODELS.get(type(v.value))
    model = VARIABLE_MODELS.get(type(v))
    return model if model is not None and model.protocols else None


def describe(v):
    if isinstance(v, (ObjectVariable, ConstantVariable)):
        value = v.value
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        return f"{type(value).__name__} {name}" if name else f"{type(value).__name__} object"
    return type(v).__name__


def wrap_const(og, value):
    if is_constant(value):
        return ConstantVariable(value)
    return og.wrap(value, None, guard=False)


def const_value(v, why="a non-constant value", _made=None):
    """The Python value of a constant Variable (containers of constants too), else Unsupported.

    A container Variable met twice gives one object, as in the program: a list that holds itself
    becomes a list that holds itself (its repr is CPython's "[[...]]"), not an endless recursion."""
    if isinstance(v, ConstantVariable):
        return v.value
    if isinstance(v, ObjectVariable) and not isinstance(v.value, (torch.nn.Module,)):
        if v.opaque:
            raise Unsupported(f"{why}: the whole contents of a {type(v.value).__qualname__} object (only its "
                              f"type is guarded)")
        return v.value
    if isinstance(v, (ListVariable, TupleVariable, DictVariable, SetVariable)):
        made = {} if _made is None else _made
        if id(v) in made:
            if made[id(v)] is _BUILDING:  # (a tuple or set reached again through its own items)
                raise Unsupported(f"{why}: a {type(v).__name__} that holds itself", kind="unsupported_object")
            return made[id(v)][0]
        return _container_value(v, why, made)
    if isinstance(v, TensorVariable):
        raise Unsupported(f"{why}: a tensor's data is needed in Python", kind="data_dependent")
    if isinstance(v, SymNodeVariable):
        return specialize(v)
    if isinstance(v, SliceVariable):
        return slice(*(const_value(p, why) for p in v.parts))
    if isinstance(v, DictViewVariable):
        return getattr(const_value(v.dict, why), v.kind)()
    if isinstance(v, MethodVariable) and isinstance(v.obj, ObjectVariable) and isinstance(v.fn, types.FunctionType):
        return types.MethodType(v.fn, v.obj.value)
    raise Unsupported(f"{why} ({describe(v)})")


_BUILDING = object()


def _container_value(v, why, made):
    """const_value of a container Variable; `made` maps id(Variable) -> (its value,) once made. A list
    or dict is entered there before its items are made (so they may hold it); a tuple or set after."""
    made[id(v)] = _BUILDING
    if isinstance(v, ListVariable):
        out = []
        made[id(v)] = (out,)
        out.extend(const_value(i, why, made) for i in v.items)
        return out
    if isinstance(v, DictVariable):
        if any(isinstance(k, VariableKey) for k in v.items):
            raise Unsupported(f"{why}: a dict with tensor or object keys", kind="unsupported_object")
        out = _empty_mapping(v, why)
        made[id(v)] = (out,)
        for k, i in odict_order.storage_items(v).items():  # (one by one: Counter's update counts; dict.update
            out[k] = const_value(i, why, made)                   # skips OrderedDict's order)
        return odict_order.relinked(out, v.items) if odict_order.differs(v) else out
    if isinstance(v, TupleVariable):
        vals = [const_value(i, why, made) for i in v.items]
        out = v.cls(*vals) if hasattr(v.cls, "_fields") else v.cls(vals)
    else:
        if v.cls not in (set, frozenset):  # (a plain set would lose the subclass's type and methods)
            raise Unsupported(f"{why}: an instance of the set subclass {v.cls.__qualname__}",
                              kind="unsupported_object")
        items = {const_value(i, why, made) for i in v.items}
        out = frozenset(items) if v.cls is frozenset else items
    made[id(v)] = (out,)
    return out


def _empty_mapping(v, why):
    """A new empty dict of `v`'s kind, for the library kinds whose repr, type and methods differ from
    dict's (OrderedDict, Counter, defaultdict); else a plain dict."""
    if v.cls in (collections.OrderedDict, collections.Counter):
        return v.cls()
    if v.cls is collections.defaultdict:
        factory = getattr(v, "default_factory", None)
        return collections.defaultdict(None if factory is None else const_value(factory, why))
    return {}


def formatted(frame, v, conv=None, spec=""):
    """The text of the f-string field `{v!conv:spec}`: the model's rendering of a Variable kind that has
    one (`text(frame, v, str or repr)`), else v's constant value formatted."""
    render = getattr(VARIABLE_MODELS.get(type(v)), "text", None)
    if render is not None and (conv is not None or spec == ""):  # (object.__format__: str(v), no spec)
        return format(render(frame, v, conv or str), spec)
    value = const_value(v, "formatting a non-constant value")
    return format(conv(value) if conv else value, spec)


def specialize(v):
    """The concrete value of a symbolic size; the shape guards then pin it."""
    if free_unbacked_symbols(v.value):
        raise Unsupported("a value computed from tensor data (item()) is needed in Python", kind="data_dependent")
    return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(v.value)](v.value)


KEY_MAKERS = {}  # a Variable kind modelled in its own module -> fn(v): the real key it hashes as, or None


def dict_key(k):
    """The key a DictVariable stores for the key Variable `k` (see key_var)."""
    if isinstance(k, TensorVariable):
        return TensorKey(k)
    if (maker := KEY_MAKERS.get(type(k))) is not None and (key := maker(k)) is not None:
        return key
    if isinstance(k, ObjectVariable) and type(k.value).__hash__ is object.__hash__:
        return k.value  # hashed by identity (a module, a plain object): its contents do not matter
    if isinstance(k, (FreshObjectVariable, FunctionVariable, PartialVariable)) and \
            inspect.getattr_static(k.python_type(), "__hash__", None) is object.__hash__:
        return VariableKey(k)  # made in the frame and hashed by identity (a partial, a function, a plain object)
    value = const_value(k, "dict key")
    try:
        hash(value)
    except TypeError as e:
        raise Unsupported(f"unhashable dict key: {e}", python_exception=e) from e
    return value


def key_var(key):
    """The Variable of a key a DictVariable stores."""
    return key.var if isinstance(key, VariableKey) else const(key)


def set_key(v):
    """What a set element hashes as: the value for constants and objects, identity for tensors."""
    if isinstance(v, (ConstantVariable, ObjectVariable)):
        return v.value
    if isinstance(v, TensorVariable):
        return ("tensor", id(v.fake))
    if isinstance(v, TupleVariable) and v.cls is tuple:  # a tuple hashes its items (a tensor by identity)
        return tuple(set_key(i) for i in v.items)
    return const_value(v, "set element")


def new_set(items, source=None):
    """A SetVariable holding `items` (added in this order, as `{a, b}` or set(iterable) would)."""
    return SetVariable([(set_key(i), i) for i in items], source)


def set_add(target, items):
    for i in items:
        target.add(set_key(i), i)


def set_update(frame, target, v):
    """`target.update(v)` as CPython does it: another set's table is merged whole (which can order the
    result differently from adding its items one by one), anything else is added item by item."""
    if isinstance(v, SetVariable):
        real, by_key = v.keys, v.vars
    elif isinstance(v, ConstantVariable) and isinstance(v.value, (set, frozenset)):
        real, by_key = v.value, {k: const(k) for k in v.value}
    else:
        set_add(target, unpack_iterable(frame, v))
        return
    target.keys.update(real)
    for k in real:
        target.vars.setdefault(k, by_key[k])


def annotations_dict(v):
    """MAKE_FUNCTION's annotations (a flat tuple name, value, name, value, ...) as a DictVariable."""
    items = v.items if isinstance(v, TupleVariable) else [const(x) for x in const_value(v)]
    return DictVariable({const_value(k): val for k, val in zip(items[::2], items[1::2])})


def make_tuple(items):
    if all(isinstance(i, ConstantVariable) for i in items):
        return const(tuple(i.value for i in items))
    return TupleVariable(items)


def _tuple_like(operands, items):
    """The result of slicing, adding or repeating tuples: a torch.Size when an operand is one (as
    torch.Size's own operators return), else a plain tuple."""
    if any(isinstance(v, TupleVariable) and v.cls is torch.Size or
           isinstance(v, ConstantVariable) and type(v.value) is torch.Size for v in operands):
        if all(isinstance(i, ConstantVariable) for i in items):
            return const(torch.Size([i.value for i in items]))
        return TupleVariable(items, cls=torch.Size)
    return make_tuple(items)


def result_var(og, value):
    """Wrap the Python result of something run natively at capture time (a constant fold)."""
    if is_constant(value):
        return ConstantVariable(value)
    if isinstance(value, list):
        return ListVariable([result_var(og, v) for v in value])
    if isinstance(value, tuple):
        return TupleVariable([result_var(og, v) for v in value], cls=type(value))
    if isinstance(value, dict):
        return DictVariable({k: result_var(og, v) for k, v in value.items()})
    if type(value) is set:
        return new_set([result_var(og, v) for v in value])
    if isinstance(value, torch.Tensor):
        raise Unsupported("a real tensor appeared during capture")
    return og.wrap(value, None, guard=False)


# ---- identity, truth, containment ---------------------------------------------------------------
def is_same(a, b):
    if a is b:
        return True
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        return a.fake is b.fake
    va, vb = getattr(a, "value", _NO), getattr(b, "value", _NO)
    if va is not _NO and vb is not _NO:
        return va is vb
    return False


_NO = object()


def truth(frame, v):
    if isinstance(v, ConstantVariable):
        return bool(v.value)
    if isinstance(v, SymNodeVariable):
        if free_unbacked_symbols(v.value):
            known = data_scalars.known_truth(v.value)
            if known is None:
                raise Unsupported("branching on a value computed from tensor data (item())", kind="data_dependent")
            return known
        return bool(v.value)
    if isinstance(v, TensorVariable):
        raise Unsupported("branching on a tensor's value (data-dependent control flow)", kind="data_dependent")
    if isinstance(v, SetVariable):
        return bool(v.keys)  # (not its items: their order is not read)
    if isinstance(v, (ListVariable, TupleVariable, DictVariable)):
        return bool(v.items)
    if isinstance(v, (FunctionVariable, MethodVariable, BaseIterator, CellVariable, PartialVariable)):
        return True
    if isinstance(v, DictViewVariable):
        return bool(v.dict.items)
    if isinstance(v, FreshObjectVariable):
        return _python_truth(frame, v, v.cls, True)
    if (model := model_of(v)) is not None:
        return model.truth(frame, v)
    if isinstance(v, ObjectVariable):
        value = v.value
        if isinstance(value, torch.nn.Module):
            if hasattr(type(value), "__len__"):
                return len(unpack_iterable(frame, v)) > 0
            return True
        t = type(value)
        if _python_dunder(t, "__bool__") or _python_dunder(t, "__len__"):
            return _python_truth(frame, v, t, True)
        if v.opaque and (hasattr(t, "__bool__") or hasattr(t, "__len__")):
            raise Unsupported(f"truth of a {t.__qualname__} known only by its type")
        return bool(value)
    raise Unsupported(f"truth value of {describe(v)}")


def _python_truth(frame, v, cls, default):
    """bool(v) as CPython decides it for an instance of `cls`: its Python __bool__, else its Python
    __len__ (!= 0), followed like any method; `default` when the class defines neither in Python."""
    for name in ("__bool__", "__len__"):
        if _python_dunder(cls, name):
            return truth(frame, call(frame, special_method(frame, v, name), [], {}))
    return default


def python_dunder(cls, name):
    return _python_dunder(cls, name)


def special_method(frame, v, name):
    """`v.name` as CPython finds a special method for an implicit call (`iter(v)`, `v + w`, `with v`):
    on the class only, so an instance attribute of that name is ignored (and need not be guarded)."""
    cls = v.python_type()
    frame.og.guards.class_unchanged(cls)
    raw = inspect.getattr_static(cls, name, None)
    if isinstance(raw, types.FunctionType):
        return MethodVariable(raw, v)
    return _class_attr(frame, v, cls, name)


def _python_dunder(cls, name):
    attr = inspect.getattr_static(cls, name, None)
    return isinstance(attr, types.FunctionType)


def python_special(frame, v, name, objects=True):
    """The special method `name` of `v`'s class when the class defines it in Python (then it runs instead
    of the built-in behaviour), bound to `v` as special_method finds it; else None. For a user object
    (unless `objects` is False: a caller that first handles the library objects it models) and for a
    container of a list/dict/set/tuple subclass (Counter.__missing__, a NamedTuple's __add__)."""
    if name is None:
        return None
    if isinstance(v, (ObjectVariable, FreshObjectVariable)):
        cls = v.python_type() if objects else None
    else:
        cls = _container_subclass(v)
    return special_method(frame, v, name) if cls is not None and _python_dunder(cls, name) else None


_BUILTIN_CONTAINER_TYPES = (list, dict, set, frozenset, tuple, collections.OrderedDict, collections.defaultdict)


def _container_subclass(v):
    """The class of a list/dict/set/tuple Variable when it is a subclass of those; else None."""
    if not isinstance(v, (ListVariable, DictVariable, SetVariable, TupleVariable)) or isinstance(v, DataDictVariable):
        return None  # (a ModelOutput is modelled as a whole)
    cls = v.python_type()
    return cls if cls not in _BUILTIN_CONTAINER_TYPES and issubclass(cls, (list, dict, set, frozenset, tuple)) else None


def delitem(frame, obj, key):
    own = python_special(frame, obj, "__delitem__") if model_of(obj) is None else None  # (else: the model's)
    if own is not None:
        call(frame, own, [key], {})
    else:
        call_method(frame, obj, "__delitem__", [key], {})


def contains(frame, container, item):
    if (own := python_special(frame, container, "__contains__", objects=False)) is not None:
        return truth(frame, call(frame, own, [item], {}))
    if isinstance(container, TensorVariable) or isinstance(item, TensorVariable) and \
            not isinstance(container, (ListVariable, TupleVariable, SetVariable)):  # a set: by identity
        raise Unsupported("`in` on a tensor's data", kind="data_dependent")
    if isinstance(container, DictVariable):
        return dict_key(item) in container.items
    if isinstance(container, DictViewVariable):
        d = container.dict.items
        if container.kind == "keys":
            return dict_key(item) in d
        if container.kind == "values":
            return contains(frame, TupleVariable(list(d.values())), item)
        pair = unpack_iterable(frame, item) if _is_tuple(item) else ()
        if len(pair) != 2 or dict_key(pair[0]) not in d:  # an items view looks the key up, then the value
            return False
        return contains(frame, TupleVariable([d[dict_key(pair[0])]]), pair[1])
    if (model := model_of(container)) is not None:
        return truth(frame, model.call_method(frame, container, "__contains__", [item], {}))
    if isinstance(container, SetVariable):
        return set_key(item) in container.keys
    if isinstance(container, (ListVariable, TupleVariable)):
        for i in container.items:
            if is_same(i, item):
                return True
            if isinstance(i, ConstantVariable) and isinstance(item, ConstantVariable) and i.value == item.value:
                return True
            if (_python_eq(i) or _python_eq(item)) and truth(frame, apply_operator(frame, operator.eq, [i, item])):
                return True  # (a class's own __eq__ runs, as PySequence_Contains calls it; it may raise)
        return False
    if (own := python_special(frame, container, "__contains__")) is not None:
        return truth(frame, call(frame, own, [item], {}))
    if isinstance(container, (ConstantVariable, ObjectVariable)) and isinstance(item, ConstantVariable):
        if _opaque(container):
            raise Unsupported(f"`in` over a {type(container.value).__qualname__} known only by its type")
        if isinstance(container.value, torch.nn.Module):
            return item.value in container.value._modules
        return item.value in container.value
    raise Unsupported(f"`in` over {describe(container)}")


# ---- operators ----------------------------------------------------------------------------------
def apply_operator(frame, op, args):
    og = frame.og
    for a in args:
        if (model := model_of(a)) is not None and (result := model.operator(frame, op, args)) is not None:
            return result
    if len(args) == 2 and (result := _subclass_operator(frame, op, *args)) is not None:  # a list subclass's own
        return result
    if op is operator.not_:
        return const(not truth(frame, args[0]))
    if op is operator.truth:
        return const(truth(frame, args[0]))
    if op is operator.getitem:
        return getitem(frame, args[0], args[1])
    if op is operator.setitem:
        setitem(frame, *args)
        return const(None)
    if op is operator.contains and not isinstance(args[0], TensorVariable):
        return const(contains(frame, args[0], args[1]))
    if op in (operator.is_, operator.is_not):
        return const(is_same(args[0], args[1]) == (op is operator.is_))
    if len(args) == 2 and op in _SET_OPS and any(isinstance(a, DictViewVariable) and a.kind != "values" for a in args):
        if op in _VIEW_OPS or op in _INPLACE_TO_BINARY and _INPLACE_TO_BINARY[op] in _VIEW_OPS:
            return _view_operator(frame, _INPLACE_TO_BINARY.get(op, op), *args)  # (a view has no in-place form)
        if op in _REFLECTED and all(_set_like(a) for a in args):
            return const(_view_compare(frame, op, *args))
        args = [new_set(view_items(a)) if isinstance(a, DictViewVariable) else a for a in args]  # comparisons
    if all(isinstance(a, SetVariable) or isinstance(a, ConstantVariable) and isinstance(a.value, frozenset)
           for a in args) and len(args) == 2 and op in _SET_OPS:
        return _set_operator(frame, op, args)
    if op in _INPLACE_TO_BINARY and isinstance(args[0], (ConstantVariable, SymNodeVariable)):
        op = _INPLACE_TO_BINARY[op]  # `total += t` with total an int: numbers have no in-place form
    if any(isinstance(a, (TensorVariable, SymNodeVariable)) for a in args):
        if op is operator.contains:
            raise Unsupported("`in` on tensor data", kind="data_dependent")
        return og.call_op("call_function", op, args, {})
    if all(isinstance(a, ConstantVariable) for a in args):
        try:
            return result_var(og, op(*(a.value for a in args)))
        except Exception as e:  # (1 // 0, "a" + 1, ...): the program's own exception, which it may catch
            raise Unsupported(f"{op.__name__} raised {type(e).__name__}: {e}", python_exception=e) from e
    a = args[0]
    if isinstance(a, (ListVariable, TupleVariable)) and \
            (own := python_special(frame, a, _DUNDERS.get(op))) is not None:  # a NamedTuple's __add__
        return call(frame, own, args[1:], {})
    if len(args) == 2:
        b = args[1]
        if op in (operator.add, operator.iadd) and isinstance(a, ListVariable) and \
                isinstance(b, (ListVariable, TupleVariable)) and (op is operator.add or True):
            if op is operator.iadd:
                a.items.extend(unpack_iterable(frame, b))
                og.side_effects.mark_mutated(a)
                return a
            if isinstance(b, ListVariable):
                return ListVariable(a.items + b.items)
        if op in (operator.add, operator.iadd) and isinstance(a, (TupleVariable, ConstantVariable)) and \
                isinstance(b, (TupleVariable, ConstantVariable)) and _is_tuple(a) and _is_tuple(b):
            return _tuple_like([a, b], unpack_iterable(frame, a) + unpack_iterable(frame, b))
        if op is operator.mul and isinstance(b, (ListVariable, TupleVariable)) and isinstance(a, ConstantVariable):
            a, b = b, a  # n * seq is seq * n
        if op in (operator.mul, operator.imul) and isinstance(a, (ListVariable, TupleVariable)) and \
                isinstance(b, ConstantVariable) and type(b.value) is int:
            items = a.items * b.value
            return ListVariable(items) if isinstance(a, ListVariable) else _tuple_like([a], items)
        if op is operator.or_ and isinstance(a, DictVariable) and isinstance(b, DictVariable) and \
                b.cls in (collections.OrderedDict, collections.defaultdict) and b.cls is not a.cls and \
                issubclass(b.cls, a.cls):  # the right operand's own __ror__ goes first: the result is of its class
            merged = call_method(frame, b, "copy", [], {})
            merged.items = {**a.items, **b.items}
            return merged
        if op in (operator.or_, operator.ior) and isinstance(a, DictVariable) and isinstance(b, DictVariable):
            return call_method(frame, a, "__ior__" if op is operator.ior else "__or__", [b], {})
        if op in (operator.or_, operator.ior) and any(isinstance(x, DictVariable) for x in (a, b)) and \
                any(isinstance(x, (ConstantVariable, ListVariable, TupleVariable)) for x in (a, b)):
            e = TypeError(f"unsupported operand type(s) for |: '{a.python_type().__name__}' and "
                          f"'{b.python_type().__name__}'")  # dict's | takes only a dict, CPython's words
            if op is operator.ior and isinstance(a, DictVariable):  # but |= takes any mapping or pairs
                return call_method(frame, a, "__ior__", [b], {})
            raise Unsupported(f"TypeError: {e}", python_exception=e)
        if op in (operator.eq, operator.ne) and (_python_eq(a) or _python_eq(b)):
            return _user_equality(frame, op, a, b)
        if op in (operator.eq, operator.ne):
            if isinstance(a, (ObjectVariable, ConstantVariable)) and isinstance(b, (ObjectVariable, ConstantVariable)) \
                    and not _opaque(a, b):
                if not isinstance(inspect.getattr_static(type(a.value), "__eq__", None), types.FunctionType):
                    return const(op(a.value, b.value))
            if isinstance(a, DictVariable) and isinstance(b, DictVariable):
                return const(_dicts_equal(frame, a, b) == (op is operator.eq))
            if type(a) is not type(b) and not (isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable)):
                return const(op is operator.ne)
            if isinstance(a, (ListVariable, TupleVariable)) and isinstance(b, (ListVariable, TupleVariable)):
                return const(_sequences_equal(frame, a, b) == (op is operator.eq))
            if a is b or (isinstance(a, (FreshObjectVariable, FunctionVariable)) or
                          isinstance(b, (FreshObjectVariable, FunctionVariable))):
                return const((a is b) == (op is operator.eq))
    name = _DUNDERS.get(op)
    if (own := python_special(frame, a, name)) is not None:
        return call(frame, own, args[1:], {})
    if isinstance(a, ObjectVariable) and all(isinstance(x, (ObjectVariable, ConstantVariable)) for x in args) \
            and not _opaque(*args):
        if not _python_dunder(type(a.value), name or "__eq__"):
            try:
                return result_var(og, op(*(x.value for x in args)))
            except Exception as e:  # run natively on the real objects: the exception eager code raises
                raise Unsupported(f"{op.__name__} raised {type(e).__name__}: {e}", python_exception=e) from e
    raise Unsupported(f"operator {op.__name__} on {', '.join(describe(x) for x in args)}")


_REFLECTED = {operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
              operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
              operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
              operator.matmul: ("__matmul__", "__rmatmul__"), operator.pow: ("__pow__", "__rpow__"),
              operator.or_: ("__or__", "__ror__"), operator.and_: ("__and__", "__rand__"),
              operator.xor: ("__xor__", "__rxor__"), operator.lshift: ("__lshift__", "__rlshift__"),
              operator.rshift: ("__rshift__", "__rrshift__"), operator.eq: ("__eq__", "__eq__"),
              operator.ne: ("__ne__", "__ne__"), operator.lt: ("__lt__", "__gt__"), operator.le: ("__le__", "__ge__"),
              operator.gt: ("__gt__", "__lt__"), operator.ge: ("__ge__", "__le__")}


def _subclass_operator(frame, op, a, b):
    """`a op b` where an operand is an instance of a list/dict/set/tuple subclass whose class defines the
    operator's method in Python, in CPython's order: an in-place method first (when it gives
    NotImplemented, or the class has none and its base no in-place form, the binary one); then the
    right operand's reflected method first when its class is a proper subclass of the left's, else the
    left's method and then the right's. None: no Python method answered (the base's C one does)."""
    if _container_subclass(a) is None and _container_subclass(b) is None:
        return None
    if op in _INPLACE_TO_BINARY:
        binary = _INPLACE_TO_BINARY[op]
        if binary not in _REFLECTED:
            return None
        name = "__i" + _REFLECTED[binary][0][2:]
        if (own := python_special(frame, a, name, objects=False)) is not None:
            result = call(frame, own, [b], {})
            if not _not_implemented(result):
                return result
        elif hasattr(a.python_type(), name):
            return None  # the left's own C in-place method (set.__ior__, list.__iadd__) runs, not a binary one
        op = binary
    if op not in _REFLECTED:
        return None
    forward, reflected = _REFLECTED[op]
    left, right = a.python_type(), b.python_type()
    mine = python_special(frame, a, forward, objects=False)
    theirs = python_special(frame, b, reflected, objects=False) if right is not left else None
    if mine is None and theirs is None:
        return None
    order = [(theirs, a), (mine, b)] if theirs is not None and issubclass(right, left) else [(mine, b), (theirs, a)]
    for method, other in order:
        if method is not None:
            result = call(frame, method, [other], {})
            if not _not_implemented(result):
                return result
    return None


def _sequence_index_error(seq, e):
    """The exception CPython raises for `seq[k]`, from the one the Python list holding a list's or
    tuple's items raised: same type, with the message naming the sequence's own kind."""
    kind = "list" if isinstance(seq, ListVariable) else "tuple"
    if isinstance(e, IndexError):
        return IndexError(f"{kind} index out of range")
    return TypeError(str(e).replace("list indices", f"{kind} indices", 1))


def _sequences_equal(frame, a, b):
    """list/tuple ==, as CPython compares them: same kind and length, then item by item, an item
    identical to its partner counting as equal without calling its __eq__."""
    if isinstance(a, ListVariable) != isinstance(b, ListVariable) or len(a.items) != len(b.items):
        return False
    for x, y in zip(a.items, b.items):
        if not is_same(x, y) and not truth(frame, apply_operator(frame, operator.eq, [x, y])):
            return False
    return True


def _dicts_equal(frame, a, b):
    """dict ==, as CPython compares them: the same keys, and each key's values equal (an identical
    value counting as equal without calling its __eq__); two OrderedDicts also in the same order."""
    if len(a.items) != len(b.items):
        return False
    if issubclass(a.cls, collections.OrderedDict) and issubclass(b.cls, collections.OrderedDict) and \
            list(a.items) != list(b.items):
        return False
    for k, x in a.items.items():
        if k not in b.items:
            return False
        y = b.items[k]
        if not is_same(x, y) and not truth(frame, apply_operator(frame, operator.eq, [x, y])):
            return False
    return True


def _python_eq(v):
    return isinstance(v, (ObjectVariable, FreshObjectVariable)) and \
        (_python_dunder(v.python_type(), "__eq__") or _python_dunder(v.python_type(), "__ne__"))


def _user_equality(frame, op, a, b):
    """`a == b` / `a != b` with a class that defines __eq__ in Python, in CPython's order: the left
    operand's method, then the reflected one when it returns NotImplemented, identity last (a subclass
    on the right overriding the method goes first)."""
    order = [(a, b), (b, a)]
    left, right = a.python_type(), b.python_type()
    if right is not left and issubclass(right, left) and _python_dunder(right, "__eq__"):
        order.reverse()
    for x, y in order:
        if not isinstance(x, (ObjectVariable, FreshObjectVariable)):
            continue
        cls = x.python_type()
        if op is operator.ne and _python_dunder(cls, "__ne__"):
            result = call(frame, special_method(frame, x, "__ne__"), [y], {})
        elif _python_dunder(cls, "__eq__"):
            result = call(frame, special_method(frame, x, "__eq__"), [y], {})
            if op is operator.ne and not _not_implemented(result):
                return const(not truth(frame, result))
        else:
            continue
        if not _not_implemented(result):
            return result
    return const(is_same(a, b) == (op is operator.eq))


def _not_implemented(v):
    return isinstance(v, (ConstantVariable, ObjectVariable)) and v.value is NotImplemented


_INPLACE_TO_BINARY = {operator.iadd: operator.add, operator.iand: operator.and_, operator.ifloordiv: operator.floordiv,
                      operator.ilshift: operator.lshift, operator.imatmul: operator.matmul, operator.imul: operator.mul,
                      operator.imod: operator.mod, operator.ior: operator.or_, operator.ipow: operator.pow,
                      operator.irshift: operator.rshift, operator.isub: operator.sub, operator.itruediv: operator.truediv,
                      operator.ixor: operator.xor}

_SET_OPS = (operator.or_, operator.and_, operator.sub, operator.xor, operator.ior, operator.iand, operator.isub,
            operator.ixor, operator.eq, operator.ne, operator.le, operator.lt, operator.ge, operator.gt)


_VIEW_OPS = (operator.or_, operator.and_, operator.sub, operator.xor)


def _set_of(v):
    """`v` as the real set of its keys a set operation works on (a set's own table), and its items."""
    if isinstance(v, SetVariable):
        return v.keys, v.vars
    if isinstance(v, ConstantVariable) and isinstance(v.value, frozenset):
        return v.value, {k: const(k) for k in v.value}
    return None


def _view_operator(frame, op, a, b):
    """`a op b` with a keys/items view on one side (a set on the other gives NotImplemented first, so
    the view's reflected method runs), as CPython's dictviews_* compute it, keeping its iteration order:
    a set of the left operand's items, then updated with the right's (a set's table merged whole, any
    other iterable item by item); `&` iterates the larger operand and keeps what the smaller holds."""
    if op is operator.and_:
        view, other = (a, b) if isinstance(a, DictViewVariable) and a.kind != "values" else (b, a)
        if isinstance(other, SetVariable) and other.cls is set and len(view.dict.items) <= len(other.keys):
            return call_method(frame, other, "intersection", [view], {})
        if isinstance(other, DictViewVariable) and other.kind != "values" and \
                len(other.dict.items) > len(view.dict.items):
            view, other = other, view
        out = new_set([])
        for item in unpack_iterable(frame, other):
            if contains(frame, view, item):  # (an items view compares the values with ==)
                out.add(set_key(item), item)
        return out
    out = new_set(view_items(a) if isinstance(a, DictViewVariable) else [])
    if not isinstance(a, DictViewVariable):
        set_update(frame, out, a)
    if op is operator.or_:
        set_update(frame, out, b)
        return out
    name = "difference_update" if op is operator.sub else "symmetric_difference_update"
    call_method(frame, out, name, [b if _set_of(b) is not None else new_set(unpack_iterable(frame, b))], {})
    return out


def _set_like(v):
    return isinstance(v, SetVariable) or isinstance(v, ConstantVariable) and isinstance(v.value, frozenset) or \
        isinstance(v, DictViewVariable) and v.kind != "values"


_SWAPPED = {operator.lt: operator.gt, operator.le: operator.ge, operator.gt: operator.lt, operator.ge: operator.le,
            operator.eq: operator.eq, operator.ne: operator.ne}


def _view_compare(frame, op, a, b):
    """A keys/items view compared with a set or view, as CPython's dictview_richcompare does it (a set
    on the left gives NotImplemented, so the view's reflected comparison runs): the sizes first, then
    each item of the smaller side looked up in the other (an items view compares the values with ==,
    which may run a class's own __eq__)."""
    if not isinstance(a, DictViewVariable) or a.kind == "values":
        return _view_compare(frame, _SWAPPED[op], b, a)
    size = {id(v): len(v.dict.items) if isinstance(v, DictViewVariable) else len(v.keys)
            if isinstance(v, SetVariable) else len(v.value) for v in (a, b)}
    la, lb = size[id(a)], size[id(b)]

    def within(x, y):
        return all(contains(frame, y, item) for item in unpack_iterable(frame, x))
    if op in (operator.eq, operator.ne):
        return (la == lb and within(a, b)) == (op is operator.eq)
    if op in (operator.lt, operator.le):
        return (la < lb if op is operator.lt else la <= lb) and within(a, b)
    return (la > lb if op is operator.gt else la >= lb) and within(b, a)


def _frozen(v):
    return isinstance(v, SetVariable) and issubclass(v.cls, frozenset) or isinstance(v, ConstantVariable)


def _set_operator(frame, op, args):
    """The operator on the sets' real key sets, so the result (and its order) is CPython's own: a new
    set or frozenset as the left operand's base (a subclass's operations make plain ones); an in-place
    operator updates a set, while a frozenset has none and gets a new frozenset."""
    if op in _INPLACE_TO_BINARY and _frozen(args[0]):
        op = _INPLACE_TO_BINARY[op]
    by_key = {}
    keysets = []
    for a in args:
        if isinstance(a, SetVariable):
            keysets.append(a.keys)
            for k, v in a.vars.items():
                by_key.setdefault(k, v)
        else:
            keysets.append(a.value)
            for k in a.value:
                by_key.setdefault(k, const(k))
    target = args[0]
    result = op(keysets[0], keysets[1])  # an in-place operator updates target.keys itself
    if isinstance(result, bool):
        return const(result)
    if isinstance(target, SetVariable) and result is target.keys:
        target.vars = {k: by_key[k] for k in result}
        frame.og.side_effects.mark_mutated(target)
        return target
    if _frozen(target):
        if all(isinstance(by_key[k], ConstantVariable) for k in result):
            return const(frozenset(result))
        out = SetVariable([(k, by_key[k]) for k in result], keys=set(result) if type(result) is not set else result)
        out.cls = frozenset
        return out
    return SetVariable([(k, by_key[k]) for k in result], keys=set(result) if type(result) is not set else result)


def _opaque(*args):
    return any(getattr(a, "opaque", False) for a in args)


def _is_tuple(v):
    return isinstance(v, TupleVariable) or (isinstance(v, ConstantVariable) and type(v.value) in (tuple, torch.Size))


_DUNDERS = {operator.add: "__add__", operator.sub: "__sub__", operator.mul: "__mul__",
            operator.truediv: "__truediv__", operator.matmul: "__matmul__", operator.eq: "__eq__",
            operator.ne: "__ne__", operator.lt: "__lt__", operator.le: "__le__", operator.gt: "__gt__",
            operator.ge: "__ge__", operator.neg: "__neg__", operator.getitem: "__getitem__"}


# ---- items --------------------------------------------------------------------------------------
def getitem(frame, obj, key, builtin=False):
    """`obj[key]`; `builtin`: the base class's own item lookup (tuple.__getitem__ called from a
    subclass's __getitem__), never the subclass's."""
    og = frame.og
    if not builtin and (own := python_special(frame, obj, "__getitem__", objects=False)) is not None:
        return call(frame, own, [key], {})
    if isinstance(obj, TensorVariable):
        return og.call_op("call_function", operator.getitem, [obj, key], {})
    if isinstance(key, TensorVariable) and not isinstance(obj, DictVariable):  # a dict: keyed by identity
        raise Unsupported("indexing a Python container with a tensor")
    if isinstance(obj, (ListVariable, TupleVariable)):
        k = const_value(key, "index")
        if isinstance(k, slice):
            items = obj.items[k]
            return ListVariable(items) if isinstance(obj, ListVariable) else _tuple_like([obj], items)
        try:
            return obj.items[k]
        except (IndexError, TypeError) as e:
            raise Unsupported(f"indexing raised {type(e).__name__}: {e}",
                              python_exception=_sequence_index_error(obj, e)) from e
    if isinstance(obj, DataDictVariable) and not isinstance(const_value(key, "index"), str):
        return getitem(frame, make_tuple(list(obj.items.values())), key)  # ModelOutput: to_tuple()[i]
    if isinstance(obj, DictVariable):
        k = dict_key(key)
        if k not in obj.items:
            factory = getattr(obj, "default_factory", None)
            if factory is not None and not is_same(factory, const(None)):
                obj.items[k] = call(frame, factory, [], {})
                frame.og.side_effects.mark_mutated(obj)
                return obj.items[k]
            if _python_dunder(obj.cls, "__missing__"):  # Counter, a dict subclass's own default
                return call(frame, getattr_var(frame, obj, "__missing__"), [key], {})
            raise Unsupported(f"KeyError {k!r}", python_exception=KeyError(k))
        return obj.items[k]
    if (model := model_of(obj)) is not None:
        return model.call_method(frame, obj, "__getitem__", [key], {})
    if isinstance(obj, ConstantVariable):
        try:
            return result_var(og, obj.value[const_value(key, "index")])
        except Exception as e:  # indexed natively: the exception eager code raises ("abc"[5])
            raise Unsupported(f"indexing raised {type(e).__name__}: {e}", python_exception=e) from e
    if isinstance(obj, ObjectVariable) and isinstance(obj.value, torch.nn.Module):
        mod = obj.value
        k = const_value(key, "module index")
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)) and type(k) is int:
            names = list(mod._modules)
            if not -len(names) <= k < len(names):
                raise Unsupported("module index out of range")
            og.guards.len_match(AttrSource(obj.source, "_modules"), mod._modules)
            return _child(og, obj, names[k])
        if isinstance(mod, torch.nn.ModuleList) and isinstance(k, slice):
            # the children themselves, as a list typed like the container (rebuilt as one at a break)
            og.guards.len_match(AttrSource(obj.source, "_modules"), mod._modules)
            return ListVariable([_child(og, obj, n) for n in list(mod._modules)[k]], cls=type(mod))
        if isinstance(mod, torch.nn.ModuleDict) and isinstance(k, str):
            return _child(og, obj, k)
        if isinstance(mod, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            k = str(k) if isinstance(mod, torch.nn.ParameterList) else k
            return og.wrap(mod._parameters[k], ItemSource(AttrSource(obj.source, "_parameters"), k))
    if isinstance(obj, ObjectVariable) and _is_typing_form(obj.value):  # List[int], Optional[T]: pure
        return fold_natively(og, operator.getitem, [obj, key], {})
    if (own := python_special(frame, obj, "__getitem__")) is not None:
        return call(frame, own, [key], {})
    raise Unsupported(f"indexing {describe(obj)}")


def _is_typing_form(value):
    return type(value).__module__ in ("typing", "typing_extensions", "types") or \
        isinstance(value, type) and hasattr(value, "__class_getitem__") and value.__module__ in ("builtins", "collections.abc", "typing")


def _child(og, mod_var, name):
    value = mod_var.value._modules[name]
    return og.wrap(value, ItemSource(AttrSource(mod_var.source, "_modules"), name))


def setitem(frame, obj, key, value):
    og = frame.og
    if (own := python_special(frame, obj, "__setitem__", objects=False)) is not None:
        call(frame, own, [key, value], {})
        return
    if isinstance(obj, TensorVariable):
        og.call_op("call_function", operator.setitem, [obj, key, value], {})
        return
    if isinstance(obj, ListVariable):
        k = const_value(key, "index")
        try:
            obj.items[k] = value if not isinstance(k, slice) else unpack_iterable(frame, value)
        except (IndexError, TypeError) as e:
            raise Unsupported(f"list assignment raised {e}") from e
        og.side_effects.mark_mutated(obj)
        return
    if isinstance(obj, DictVariable):
        obj.items[dict_key(key)] = value
        if isinstance(obj, DataDictVariable):
            obj.fields[dict_key(key)] = value
        og.side_effects.mark_mutated(obj)
        return
    if (model := model_of(obj)) is not None:
        model.call_method(frame, obj, "__setitem__", [key, value], {})
        return
    if (own := python_special(frame, obj, "__setitem__")) is not None:
        call(frame, own, [key, value], {})
        return
    raise Unsupported(f"item assignment on {describe(obj)}")


# ---- iteration ----------------------------------------------------------------------------------
def unpack_iterable(frame, v):
    """All the items of iterable `v`, consuming it if it is an iterator."""
    if (own := python_special(frame, v, "__iter__", objects=False)) is not None:
        return unpack_iterable(frame, call(frame, own, [], {}))
    if isinstance(v, (ListVariable, TupleVariable, SetVariable)):
        return list(v.items)
    if isinstance(v, DictVariable):
        return [key_var(k) for k in v.items]
    if isinstance(v, DictViewVariable):
        return view_items(v)
    if isinstance(v, BaseIterator):
        items = []
        while (item := iter_next(frame, v)) is not None:
            items.append(item)
        return items
    if isinstance(v, ConstantVariable) and isinstance(v.value, (tuple, str, range, frozenset, bytes, torch.Size)):
        if isinstance(v.value, frozenset):
            SetVariable.order_reads += 1  # (capture_cache: an order that follows string hashing)
        return [const(x) for x in v.value]
    if isinstance(v, TensorVariable):
        if v.fake.dim() == 0:
            raise Unsupported("iterating over a 0-d tensor")
        # one x[i] per row, as torch.compile records it (a size that is symbolic is pinned: the count is fixed)
        return [frame.og.call_op("call_function", operator.getitem, [v, const(i)], {})
                for i in range(int(v.fake.shape[0]))]
    if isinstance(v, ObjectVariable) and isinstance(v.value, torch.nn.Module):
        mod = v.value
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            frame.og.guards.len_match(AttrSource(v.source, "_modules"), mod._modules)
            return [_child(frame.og, v, name) for name in mod._modules]
        if isinstance(mod, torch.nn.ModuleDict):
            frame.og.guards.keys_match(AttrSource(v.source, "_modules"), mod._modules)
            return [const(k) for k in mod._modules]
        if isinstance(mod, torch.nn.ParameterList):
            frame.og.guards.keys_match(AttrSource(v.source, "_parameters"), mod._parameters)
            return [og_param(frame.og, v, k) for k in mod._parameters]
    if (model := model_of(v)) is not None:
        return unpack_iterable(frame, model.call_method(frame, v, "__iter__", [], {}))
    if isinstance(v, ObjectVariable) and not v.opaque and isinstance(v.value, (types.MappingProxyType, type({}.keys()),
                                                                                type({}.values()), type({}.items()))):
        return [result_var(frame.og, x) for x in v.value]  # views of objects known by value
    if isinstance(v, (ObjectVariable, FreshObjectVariable)) and _python_dunder(v.python_type(), "__iter__"):
        it = call(frame, special_method(frame, v, "__iter__"), [], {})
        if isinstance(it, (ObjectVariable, FreshObjectVariable)) and _python_dunder(it.python_type(), "__next__"):
            return _drain(frame, it)  # an iterator object of the user's (often `return self`)
        return unpack_iterable(frame, it)
    if isinstance(v, (ObjectVariable, FreshObjectVariable)) and _python_dunder(v.python_type(), "__next__"):
        return _drain(frame, v)
    if isinstance(v, ConstantVariable) and not hasattr(type(v.value), "__iter__"):  # CPython's words
        e = TypeError(f"'{type(v.value).__name__}' object is not iterable")
        raise Unsupported(f"TypeError: {e}", python_exception=e)
    raise Unsupported(f"iterating over {describe(v)}")


def view_items(view):
    """The items a dict view yields now."""
    d = view.dict.items
    if view.kind == "keys":
        return [key_var(k) for k in d]
    if view.kind == "values":
        return list(d.values())
    return [make_tuple([key_var(k), v]) for k, v in d.items()]


_MAX_ITEMS = 100_000


def _drain(frame, it):
    """The items a Python-level iterator gives: stepped as iter_next steps it (ObjectIterator) until
    its __next__ raises StopIteration."""
    items, stepper = [], ObjectIterator(it)
    while len(items) < _MAX_ITEMS:
        item = _object_next(frame, stepper)
        if item is None:
            return items
        items.append(item)
    raise Unsupported("an iterator gave too many items during capture")


def get_iter(frame, v):
    """`iter(v)`: the iterator CPython makes, as lazy and as live (a list iterator sees appends; a
    dict iterator notices a change of size)."""
    if isinstance(v, BaseIterator):
        return v
    if isinstance(v, (ListVariable, TupleVariable)) or \
            isinstance(v, ConstantVariable) and isinstance(v.value, (tuple, str, range, bytes)):
        return SequenceIterator(v)
    if isinstance(v, DictVariable):
        return DictIterator(v, "keys")
    if isinstance(v, DictViewVariable):
        return DictIterator(v.dict, v.kind)
    if isinstance(v, ObjectVariable) and isinstance(v.value, _MODULE_CONTAINERS):  # their children, guarded
        return IteratorVariable(unpack_iterable(frame, v), cls=type(iter({}.values())))
    if isinstance(v, (ObjectVariable, FreshObjectVariable)) and _python_dunder(v.python_type(), "__iter__"):
        it = call(frame, special_method(frame, v, "__iter__"), [], {})
        if isinstance(it, (ObjectVariable, FreshObjectVariable)) and _python_dunder(it.python_type(), "__next__"):
            return ObjectIterator(it)  # stepped by its own __next__, lazily (`return self` included)
        return get_iter(frame, it)
    kind = _SET_ITERATOR if isinstance(v, SetVariable) or \
        isinstance(v, ConstantVariable) and isinstance(v.value, frozenset) else type(iter([]))
    return IteratorVariable(unpack_iterable(frame, v), cls=kind)


_SET_ITERATOR = type(iter(set()))
_MODULE_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict, torch.nn.ParameterList)


def get_reversed(frame, v):
    """`reversed(v)`: over a list, live (CPython's list_reverseiterator); else over the items now."""
    if isinstance(v, (ListVariable, TupleVariable)) or \
            isinstance(v, ConstantVariable) and isinstance(v.value, (tuple, str, range, bytes)):
        return SequenceIterator(v, reverse=True, length=_sequence_len(v))
    if isinstance(v, (ObjectVariable, FreshObjectVariable)) and _python_dunder(v.python_type(), "__reversed__"):
        return get_iter(frame, call(frame, special_method(frame, v, "__reversed__"), [], {}))
    items = unpack_iterable(frame, v)
    kind = type(reversed(getattr({}, v.kind)())) if isinstance(v, DictViewVariable) else \
        type(reversed({})) if isinstance(v, DictVariable) else type(reversed([]))
    return IteratorVariable(list(reversed(items)), cls=kind)


def iter_next(frame, it):
    """The next item of iterator `it`, or None once it is exhausted; whatever producing the item
    does (map's call, a generator's body, filter's test) happens now, as in CPython."""
    if isinstance(it, (IteratorVariable, GeneratorVariable)):
        return it.next()
    if isinstance(it, ObjectIterator):
        return _object_next(frame, it)
    if isinstance(it, SequenceIterator):
        return _sequence_next(it)
    if isinstance(it, DictIterator):
        return _dict_next(it)
    if isinstance(it, MapIterator):
        args = []
        for sub in it.iterators:
            item = iter_next(frame, sub)
            if item is None:
                return None
            args.append(item)
        return call(frame, it.fn, args, {})
    if isinstance(it, ZipIterator):
        return _zip_next(frame, it)
    if isinstance(it, FilterIterator):
        while (item := iter_next(frame, it.iterator)) is not None:
            test = item if is_same(it.fn, const(None)) else call(frame, it.fn, [item], {})
            if truth(frame, test):
                return item
        return None
    if isinstance(it, EnumerateIterator):
        item = iter_next(frame, it.iterator)
        if item is None:
            return None
        it.count += 1
        return make_tuple([const(it.count - 1), item])
    if (step := ITERATOR_STEPS.get(type(it))) is not None:
        return step(frame, it)
    raise Unsupported(f"next() on {describe(it)}")


def _sequence_len(seq):
    return len(seq.value) if isinstance(seq, ConstantVariable) else len(seq.items)


def _sequence_next(it):
    if it.done:
        return None
    if 0 <= it.index < _sequence_len(it.seq):
        seq, i = it.seq, it.index
        it.index += -1 if it.reverse else 1
        return const(seq.value[i]) if isinstance(seq, ConstantVariable) else seq.items[i]
    it.done = True  # CPython drops the sequence: a list that grows later is not seen
    return None


def _object_next(frame, it):
    if it.done:
        return None
    try:
        return call(frame, special_method(frame, it.obj, "__next__"), [], {})
    except Unsupported as e:
        if isinstance(e.python_exception, StopIteration):
            it.done = True
            return None
        raise


def _dict_next(it):
    d = it.dict.items
    if len(d) != it.size:
        it.size = -1  # CPython keeps raising once it has noticed
        raise Unsupported("dictionary changed size during iteration",
                          python_exception=RuntimeError("dictionary changed size during iteration"))
    if it.pos >= len(d):
        return None
    key = list(d)[it.pos]
    it.pos += 1
    if it.kind == "keys":
        return key_var(key)
    return d[key] if it.kind == "values" else make_tuple([key_var(key), d[key]])


def _zip_next(frame, it):
    items = []
    for i, sub in enumerate(it.iterators):
        item = iter_next(frame, sub)
        if item is None:
            if it.strict:
                _zip_strict_check(frame, it, i)
            return None
        items.append(item)
    return make_tuple(items) if items else None


def _zip_strict_check(frame, it, i):
    """zip(strict=True) stopped at argument i: raise CPython's ValueError unless all are exhausted."""
    def args(n):
        return f"argument{'s' if n > 1 else ''} 1{f'-{n}' if n > 1 else ''}"
    if i > 0:
        msg = f"zip() argument {i + 1} is shorter than {args(i)}"
    else:
        longer = next((j for j, sub in enumerate(it.iterators[1:], 1) if iter_next(frame, sub) is not None), None)
        if longer is None:
            return
        msg = f"zip() argument {longer + 1} is longer than {args(longer)}"
    raise Unsupported(msg, python_exception=ValueError(msg))


def og_param(og, mod_var, name):
    return og.wrap(mod_var.value._parameters[name], ItemSource(AttrSource(mod_var.source, "_parameters"), name))


def dict_items(frame, v):
    """The items of a mapping unpacked by ** (key -> Variable)."""
    if isinstance(v, DictVariable):
        return dict(v.items)
    if isinstance(v, ConstantVariable) and isinstance(v.value, dict):
        return {k: const(x) for k, x in v.value.items()}
    if is_mapping_object(v):
        return mapping_items(frame, v)
    raise Unsupported(f"** over {describe(v)}")


# ---- attributes ---------------------------------------------------------------------------------
_BASE_TYPES = (list, tuple, dict, set, frozenset)
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (or type()), not built in
_BUILTIN_CONTAINERS = (dict, list, set, frozenset, tuple, str, bytes, collections.OrderedDict, collections.defaultdict)
_TENSOR_VALUE_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
# what collections.namedtuple itself puts in a class (a NamedTuple's own methods are the others)
_NAMEDTUPLE_MACHINERY = set(collections.namedtuple("_Probe", "field").__dict__) - {"field"}


def getattr_var(frame, obj, name):
    og = frame.og
    if isinstance(obj, HandlerVariable):
        return obj.var_getattr(frame, name)
    if isinstance(obj, TensorVariable):
        return _tensor_attr(og, obj, name)
    if isinstance(obj, SymNodeVariable):  # a number's own methods (is_integer, bit_length) see its value,
        obj = const(specialize(obj))        # which the shape guards then pin
    if isinstance(obj, ConstantVariable) and name in ("__iter__", "__reversed__"):  # `range(5).__iter__()`
        return MethodVariable(name, obj)
    if isinstance(obj, ConstantVariable):
        try:
            return result_var(og, getattr(obj.value, name))
        except AttributeError as e:
            raise Unsupported(f"AttributeError: {e}", python_exception=e) from e
    if (model := VARIABLE_MODELS.get(type(obj))) is not None:
        return model.attribute(frame, obj, name)
    if isinstance(obj, DataDictVariable):
        if name in obj.fields:
            return obj.fields[name]
        if isinstance(inspect.getattr_static(obj.cls, name, None), (types.FunctionType, property, classmethod)):
            return _class_attr(frame, obj, obj.cls, name)
    if isinstance(obj, TupleVariable) and obj.cls is not tuple:  # namedtuple / torch.return_types field
        names = getattr(obj.cls, "_fields", None) or getattr(obj.cls, "__match_args__", ())
        if name in names:
            return obj.items[names.index(name)]
        if name in ("_replace", "_asdict") and hasattr(obj.cls, "_fields"):
            return MethodVariable(name, obj)
    if isinstance(obj, (ListVariable, TupleVariable, DictVariable, SetVariable)):
        if name in ("__class__",):
            return og.wrap(obj.python_type(), None, guard=False)
        if name == "default_factory" and hasattr(obj, "default_factory"):
            return obj.default_factory
        if name in obj.attrs:
            return obj.attrs[name]
        cls = obj.python_type()
        if cls not in _BASE_TYPES and not (hasattr(cls, "_fields") and name in _NAMEDTUPLE_MACHINERY):
            # (a user's class only: a C class's methods, OrderedDict.move_to_end, are the base's, modelled)
            defined = any(name in k.__dict__ for k in cls.__mro__ if k.__flags__ & _HEAP_TYPE)
            if defined or (not hasattr(cls.__mro__[-2], name) and _python_dunder(cls, "__getattr__")):
                return _class_attr(frame, obj, cls, name)  # a method (or __getattr__) of the subclass
        if not hasattr(cls, name):  # (hasattr(a_dict, "to") is False, as in Python)
            e = AttributeError(f"'{cls.__name__}' object has no attribute '{name}'")
            raise Unsupported(f"AttributeError: {e}", python_exception=e)
        return MethodVariable(name, obj)
    if isinstance(obj, FreshObjectVariable):
        hook = inspect.getattr_static(obj.cls, "__getattribute__", None)
        if isinstance(hook, types.FunctionType):  # the class's own __getattribute__ (it may call super's)
            return call(frame, MethodVariable(hook, obj), [const(name)], {})
        return fresh_attr(frame, obj, name)
    if isinstance(obj, SuperVariable):
        return _super_attr(frame, obj, name)
    if isinstance(obj, (BaseIterator, DictViewVariable)) and name in ("__iter__", "__next__", "__reversed__"):
        return MethodVariable(name, obj)
    if isinstance(obj, DictViewVariable) and name == "mapping":  # a read-only proxy of the live dict
        return call(frame, og.wrap(types.MappingProxyType, None, guard=False), [obj.dict], {})
    if isinstance(obj, ObjectVariable):
        if name == "__dict__" and _has_plain_instance_dict(obj):
            return instance_dict(frame, obj)
        if name == "__traceback__" and obj.source is None and isinstance(obj.value, BaseException):
            return traceback_of(og, obj.value)  # (not the None capture's frameless raise left there)
        stored = og.side_effects.load_attr(obj.value, name)
        if stored is og.side_effects.DELETED:
            raise Unsupported(f"AttributeError: {name} was deleted", python_exception=AttributeError(name))
        if stored is not None:
            return stored
        if (model := model_of(obj)) is not None:
            return model.attribute(frame, obj, name)
        return _object_attr(frame, obj, name)
    if isinstance(obj, GradModeVariable) and name in ("__enter__", "__exit__"):
        raise Unsupported("explicit __enter__/__exit__ calls")
    raise Unsupported(f"attribute {name!r} of {describe(obj)}")


def _has_plain_instance_dict(obj):
    """An existing object whose attributes live in a plain __dict__ (not a module, class or function,
    whose attribute machinery capture models on its own)."""
    value = obj.value
    return obj.source is not None and isinstance(getattr(value, "__dict__", None), dict) and \
        not isinstance(value, (type, types.ModuleType, types.FunctionType, torch.nn.Module))


def instance_dict(frame, obj):
    """`obj.__dict__` of an existing object: the Variable of its real __dict__, which from then on
    holds the object's attributes for the rest of the capture (attribute stores made before are
    moved into it, later reads, writes and deletes go through it), so `obj.c = 3` shows in
    `obj.__dict__` and `obj.__dict__["a"] = 1` in `obj.a`; written back after the graph as a changed
    dict."""
    se = frame.og.side_effects
    tracked = se.instance_dicts.get(id(obj.value))
    if tracked is None:
        tracked = frame.og.wrap(obj.value.__dict__, AttrSource(obj.source, "__dict__"))
        pending = se.pop_attr_stores(obj.value)
        for name, value in pending:
            if value is se.DELETED:
                tracked.items.pop(name, None)
            else:
                tracked.items[name] = value
        if pending:
            se.mark_mutated(tracked)
        se.instance_dicts[id(obj.value)] = tracked
    return tracked


def fresh_attr(frame, obj, name):
    """object.__getattribute__ on an object made in the frame: a data descriptor (property), its
    __dict__, then its class."""
    raw = inspect.getattr_static(obj.cls, name, None)
    if isinstance(raw, property) or name == "__dict__":
        if name == "__dict__":
            d = DictVariable({})
            d.items = obj.attrs  # the same dict: writes through __dict__ are attribute writes
            return d
        return _class_attr(frame, obj, obj.cls, name)
    if name in obj.attrs:
        return obj.attrs[name]
    if name == "__class__":
        return frame.og.wrap(obj.cls, None, guard=False)
    return _class_attr(frame, obj, obj.cls, name)


def store_fresh_attr(frame, obj, name, value):
    """object.__setattr__ on an object made in the frame: a property's setter, else its __dict__."""
    raw = inspect.getattr_static(obj.cls, name, None)
    if isinstance(raw, property):
        if raw.fset is None:
            e = AttributeError(f"property {name!r} of {obj.cls.__name__!r} object has no setter")  # CPython's words
            raise Unsupported(f"AttributeError: {e}", python_exception=e)
        call(frame, MethodVariable(raw.fset, obj), [value], {})
        return
    obj.attrs[name] = value


def delattr_var(frame, obj, name):
    """`del obj.name`: the class's own __delattr__, else the attribute leaves the object's __dict__
    (an existing object's deletion is replayed after the graph)."""
    hook = inspect.getattr_static(obj.python_type(), "__delattr__", None) \
        if isinstance(obj, (FreshObjectVariable, ObjectVariable)) else None
    if isinstance(hook, types.FunctionType):
        call(frame, MethodVariable(hook, obj), [const(name)], {})
        return
    if isinstance(obj, FreshObjectVariable):
        if name not in obj.attrs:
            raise Unsupported(f"AttributeError: {name}", python_exception=AttributeError(name))
        del obj.attrs[name]
        return
    if type(obj) in VARIABLE_MODELS and name in getattr(getattr(obj, "attrs", None), "items", ()):
        del obj.attrs.items[name]  # a function's or partial's __dict__ entry
        return
    if isinstance(obj, ObjectVariable) and obj.source is not None and isinstance(getattr(obj.value, "__dict__", None), dict) \
            and not isinstance(obj.value, (type, types.ModuleType, torch.nn.Module)):
        se = frame.og.side_effects
        if (tracked := se.instance_dicts.get(id(obj.value))) is not None:
            if name not in tracked.items:
                raise Unsupported(f"AttributeError: {name}", python_exception=AttributeError(name))
            del tracked.items[name]
            se.mark_mutated(tracked)
            return
        pending = se.load_attr(obj.value, name)
        if name in obj.value.__dict__ and pending is not se.DELETED:
            frame.og.guards.in_instance_dict(obj.source, name, True, f"{obj.source!r}.{name} is set")
            se.store_attr(obj, name, se.DELETED)
        elif pending is not None and pending is not se.DELETED:
            se.forget_attr(obj.value, name)  # set and deleted within the frame: nothing to replay
        else:
            raise Unsupported(f"AttributeError: {name}", python_exception=AttributeError(name))
        return
    raise Unsupported(f"del of attribute {name!r} of {describe(obj)}")


def _assign_tensor_data(og, t, value):
    """`t.data = value` on a tensor from outside the frame: t keeps its identity and its autograd
    state and takes value's data (storage, shape, strides, dtype). The assignment is replayed on the
    real tensor after the graph, in program order with other ones (so `x.data = y; y.data = z` gives
    x y's old data); until then t reads, in the graph, as an alias of value without grad (its detach).
    A t that requires grad keeps that flag, and an op on it while grad is on is a graph break: its
    gradient would belong to t, which the graph cannot express."""
    if not isinstance(value, TensorVariable):
        raise Unsupported(f"Tensor.data set to {describe(value)}")
    if t.source is None:
        raise Unsupported("setting .data of a tensor made in the frame", kind="tensor_data_assignment")
    if t.fake.requires_grad and not t.fake.is_leaf:
        raise Unsupported("setting .data of a tensor computed with grad (it keeps its grad_fn)",
                          kind="tensor_data_assignment")
    if value.fake.layout != torch.strided or t.fake.layout != torch.strided or value.fake.device != t.fake.device:
        raise Unsupported("setting .data across devices or layouts", kind="tensor_data_assignment")
    alias = og.call_op("call_method", "detach", [value], {})
    if t.fake.requires_grad:
        alias.fake.requires_grad_(True)
    og.side_effects.store_tensor_data(t, value)
    og.rebind_tensor(t, alias.node, alias.fake)


def _tensor_attr(og, t, name):
    if name in ("grad", "grad_fn", "_version", "_base", "_cdata"):
        raise Unsupported(f"Tensor.{name} during capture")
    if name == "data":
        return og.call_op("call_method", "detach", [t], {})
    if name in _TENSOR_VALUE_ATTRS:
        return og.call_op("call_function", getattr, [t, const(name)], {})
    if name == "__class__":
        return og.wrap(t.python_type(), None, guard=False)
    stored = og.side_effects.load_attr(t.fake, name)
    if stored is not None:
        return stored
    if inspect.getattr_static(t.cls, name, _NO) is _NO:
        return _tensor_python_attr(og, t, name)
    try:
        attr = getattr(t.fake, name)
    except AttributeError as e:
        raise Unsupported(f"AttributeError: {e}", python_exception=e) from e
    if callable(attr):
        return MethodVariable(name, t)
    if name == "shape" and any(isinstance(d, torch.SymInt) for d in attr):
        return og.call_op("call_method", "size", [t], {})
    if isinstance(attr, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return og.call_op("call_function", getattr, [t, const(name)], {})
    if isinstance(attr, torch.Tensor):
        raise Unsupported(f"tensor-valued attribute Tensor.{name}")
    if not is_constant(attr):
        raise Unsupported(f"Tensor.{name} of type {type(attr).__name__}")
    if name in TENSOR_FACTS:  # `x.is_leaf`: a fact the tensor guard does not cover
        og.guard_tensor_fact(name, [t])
    return const(attr)


def _tensor_python_attr(og, t, name):
    """An attribute Tensor does not define: only the tensor's own __dict__ can hold it (`x.test = 1`).
    An input's is read and guarded present, or guarded absent; a tensor made in the frame has only
    what the frame set on it."""
    real = og.real_tensor(t.source) if t.source is not None else None
    if real is not None:
        if name in real.__dict__:
            return og.wrap(real.__dict__[name], AttrSource(t.source, name))
        og.guards.in_instance_dict(t.source, name, False, f"{t.source!r} has no attribute {name!r}")
    raise Unsupported(f"AttributeError: {t.cls.__name__} has no attribute {name!r}",
                      python_exception=AttributeError(name))


def _object_attr(frame, obj, name, plain=False):
    """Attribute lookup on an existing object; `plain` skips a Python-level __getattribute__ (it is what
    object.__getattribute__ does when that override calls super())."""
    og, value, source = frame.og, obj.value, obj.source
    if not isinstance(value, types.ModuleType):
        og.guards.class_unchanged(value if isinstance(value, type) else type(value))
    if not plain and not isinstance(value, (type, types.ModuleType)):
        hook = inspect.getattr_static(type(value), "__getattribute__", None)
        if isinstance(hook, types.FunctionType):
            return call(frame, MethodVariable(hook, obj), [const(name)], {})
    if isinstance(value, types.ModuleType):
        stored = og.side_effects.load_module_global(value.__dict__, name)
        if stored is not None:  # a global of that module the frame (or a callee) has set
            return stored
        try:
            attr = getattr(value, name)
        except AttributeError as e:
            raise Unsupported(f"AttributeError: {e}", python_exception=e) from e
        # functions and classes of library modules (torch.sin) are fixed: no guard per function used;
        # their flags (torch.backends.cudnn.enabled) are settings a program may change between calls
        flag = type(attr) in (bool, int, float, str)
        return og.wrap(attr, AttrSource(source if source is not None else ConstSource(value), name),
                       guard=flag or not is_library_module(value))
    if isinstance(value, torch.nn.Module):
        return _module_attr(frame, obj, name)
    if isinstance(value, type):
        try:
            raw = inspect.getattr_static(value, name)
        except AttributeError as e:
            meta_hook = inspect.getattr_static(type(value), "__getattr__", None)
            if isinstance(meta_hook, types.FunctionType):  # a metaclass's own __getattr__
                return call(frame, MethodVariable(meta_hook, obj), [const(name)], {})
            raise Unsupported(f"AttributeError: {e}", python_exception=e) from e
        if isinstance(raw, classmethod):
            return _classmethod_attr(frame, raw, obj)
        if isinstance(raw, staticmethod):
            return og.wrap(raw.__func__, None, guard=False)
        attr = getattr(value, name)
        if not value.__flags__ & _HEAP_TYPE:  # a builtin (static) type's attributes cannot change
            return og.wrap(attr, None, guard=False)
        # a class attribute can be reassigned between calls: reload and guard it through the class
        return og.wrap(attr, AttrSource(source if source else ConstSource(value), name))
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)) or callable(value) \
            and not hasattr(value, "__dict__"):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return const(getattr(value, name))
        if isinstance(value, types.MethodType) and name in ("__self__", "__func__"):
            return og.wrap(getattr(value, name), AttrSource(source, name) if source else None)
    inst_dict = getattr(value, "__dict__", None)
    cls_attr = inspect.getattr_static(type(value), name, _NO)
    is_data_descriptor = cls_attr is not _NO and _is_data_descriptor(cls_attr)
    if (tracked := og.side_effects.instance_dicts.get(id(value))) is not None and not is_data_descriptor:
        if name in tracked.items:  # its __dict__ as the frame has changed it
            return tracked.items[name]
        return _class_attr(frame, obj, type(value), name)
    if isinstance(inst_dict, dict) and name in inst_dict and not is_data_descriptor:
        return og.wrap(inst_dict[name], AttrSource(source, name) if source else None, guard=source is not None)
    if isinstance(inst_dict, dict) and source is not None and not is_data_descriptor:
        og.guards.in_instance_dict(source, name, False, f"{source!r}.{name} comes from its class")
    return _class_attr(frame, obj, type(value), name)


def _is_data_descriptor(attr):
    """A class attribute that takes precedence over the instance __dict__ (a property, a slot)."""
    return hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")


def _module_attr(frame, obj, name):
    """`module.name` in CPython's order: a data descriptor of the class (a property), the instance
    __dict__, any other class attribute (a method shadows a submodule of the same name), then the
    class's __getattr__ (nn.Module's looks in _parameters, _buffers and _modules). The class is
    guarded unchanged; a class attribute found is guarded absent from the instance __dict__, where
    a plain assignment would put it. nn.Module.__setattr__ keeps the instance __dict__ and the three
    stores apart, so a store entry needs only its own guard."""
    og, mod, source = frame.og, obj.value, obj.source
    cls = type(mod)
    og.guards.class_unchanged(cls)
    raw = inspect.getattr_static(cls, name, _NO)
    if raw is not _NO and _is_data_descriptor(raw):
        return _class_attr(frame, obj, cls, name)
    d = mod.__dict__
    if name in d:
        return og.wrap(d[name], AttrSource(source, name))
    if raw is not _NO:
        if source is not None:
            og.guards.in_instance_dict(source, name, False, f"{source!r}.{name} comes from its class")
        return _class_attr(frame, obj, cls, name)
    hook = inspect.getattr_static(cls, "__getattr__", None)
    if isinstance(hook, types.FunctionType) and hook is not _MODULE_GETATTR:
        return call(frame, MethodVariable(hook, obj), [const(name)], {})
    return module_store_attr(frame, obj, name)


_MODULE_GETATTR = torch.nn.Module.__getattr__
_MODULE_CALL = inspect.getattr_static(torch.nn.Module, "__call__")
_MODULE_CALL_IMPL = inspect.getattr_static(torch.nn.Module, "_call_impl")


def module_store_attr(frame, obj, name):
    """What nn.Module.__getattr__ finds: a parameter, buffer or submodule of that name."""
    d = obj.value.__dict__
    for store in ("_parameters", "_buffers", "_modules"):
        if name in d.get(store, ()):
            return frame.og.wrap(d[store][name], ItemSource(AttrSource(obj.source, store), name))
    if obj.source is not None:  # `getattr(self, "calls", 0)`: absent now, maybe set by the next call
        frame.og.guards.add(obj.source, f"{name!r} not in v.__dict__ and {name!r} not in v._parameters and "
                                        f"{name!r} not in v._buffers and {name!r} not in v._modules",
                            f"{obj.source!r} has no attribute {name!r}")
    raise Unsupported(f"AttributeError: {type(obj.value).__qualname__} has no attribute {name!r}",
                      python_exception=AttributeError(name))


def _class_attr(frame, obj, cls, name):
    og = frame.og
    og.guards.class_unchanged(cls)
    try:
        raw = inspect.getattr_static(cls, name)
    except AttributeError:
        getattr_hook = inspect.getattr_static(cls, "__getattr__", None)
        if isinstance(getattr_hook, types.FunctionType):
            return call(frame, MethodVariable(getattr_hook, obj), [const(name)], {})
        raise Unsupported(f"AttributeError: {cls.__qualname__} has no attribute {name!r}",
                          python_exception=AttributeError(name)) from None
    if isinstance(raw, types.FunctionType):
        return MethodVariable(raw, obj)
    if isinstance(raw, staticmethod):
        return og.wrap(raw.__func__, None, guard=False)
    if isinstance(raw, classmethod):
        return _classmethod_attr(frame, raw, og.wrap(cls, None, guard=False))
    if isinstance(raw, property):
        if raw.fget is None:
            raise Unsupported(f"unreadable property {name}")
        return call(frame, MethodVariable(raw.fget, obj), [], {})
    if isinstance(raw, functools.cached_property):
        raise Unsupported("functools.cached_property")
    if isinstance(raw, (types.MethodDescriptorType, types.WrapperDescriptorType)) and \
            raw.__objclass__ in _BUILTIN_CONTAINERS:
        return MethodVariable(raw, obj)  # a method of dict/list/...: modelled (library_models), not a new object each read
    if isinstance(obj, ObjectVariable) and obj.source is not None:
        try:
            value = getattr(obj.value, name)
        except AttributeError as e:  # an unset __slots__ slot: absent now, maybe set by the next call
            og.guards.add(obj.source, f"not hasattr(v, {name!r})", f"{obj.source!r} has no attribute {name!r}")
            raise Unsupported(f"AttributeError: {e}", python_exception=e) from None
        if isinstance(value, types.MethodType) and value.__self__ is obj.value:
            return MethodVariable(value.__func__, obj)
        return og.wrap(value, AttrSource(obj.source, name))
    if hasattr(type(raw), "__get__") and not isinstance(raw, (types.BuiltinFunctionType,)):
        if type(raw) in TYPE_MODELS and not hasattr(type(raw), "__set__"):
            return MethodVariable(raw, obj)  # a modelled callable that binds like a function (an lru_cache'd method)
        if isinstance(raw, (types.WrapperDescriptorType, types.MethodDescriptorType)):
            return MethodVariable(raw, obj)
        if isinstance(raw, (types.MemberDescriptorType, types.GetSetDescriptorType)) and isinstance(obj, ObjectVariable):
            return og.wrap(getattr(obj.value, name), None, guard=False)  # a slot of an object known by value
        raise Unsupported(f"descriptor {type(raw).__name__} {name}")
    # a class-level value (MyClass.scale): guarded through the class, which may be reassigned later
    return og.wrap(raw, AttrSource(ConstSource(cls), name))


# Python 3.9-3.12: a classmethod binds through the descriptor it wraps (classmethod(property(f)) reads
# as f(cls), a class-level property); 3.13 binds the wrapped object as a plain function
_CLASSMETHOD_CHAINS = sys.version_info < (3, 13)


def _classmethod_attr(frame, raw, cls_var):
    """`cls.name` where the class holds classmethod `raw`: bound to the class `cls_var`."""
    inner = raw.__func__
    if _CLASSMETHOD_CHAINS and not isinstance(inner, types.FunctionType) and hasattr(type(inner), "__get__"):
        if isinstance(inner, property) and inner.fget is not None:
            return call(frame, MethodVariable(inner.fget, cls_var), [], {})
        raise Unsupported(f"a classmethod over a {type(inner).__name__}")
    return MethodVariable(inner, cls_var)


def _super_attr(frame, sup, name):
    mro = sup.obj.python_type().__mro__ if not isinstance(sup.obj, ObjectVariable) or \
        not isinstance(sup.obj.value, type) else sup.obj.value.__mro__
    start = mro.index(sup.cls) + 1
    for klass in mro[start:]:
        if name in klass.__dict__:
            raw = klass.__dict__[name]
            if isinstance(raw, types.FunctionType):
                return MethodVariable(raw, sup.obj)
            if isinstance(raw, classmethod):
                return _classmethod_attr(frame, raw, frame.og.wrap(sup.obj.python_type(), None, guard=False))
            if isinstance(raw, staticmethod):
                return frame.og.wrap(raw.__func__, None, guard=False)
            if isinstance(raw, property):
                return call(frame, MethodVariable(raw.fget, sup.obj), [], {})
            if isinstance(raw, (types.WrapperDescriptorType, types.MethodDescriptorType)):
                return MethodVariable(raw, sup.obj)
            return wrap_const(frame.og, raw)
    raise Unsupported(f"super() has no attribute {name!r}")


def setattr_var(frame, obj, name, value):
    og = frame.og
    if isinstance(obj, HandlerVariable):
        return obj.var_setattr(frame, name, value)
    if isinstance(obj, TensorVariable):  # a Python attribute on the tensor: replayed after the graph
        if name == "data":
            return _assign_tensor_data(og, obj, value)
        if inspect.getattr_static(obj.cls, name, _NO) is not _NO:
            raise Unsupported(f"setting Tensor.{name} during capture")
        og.side_effects.store_attr(obj, name, value)
        return
    if (model := VARIABLE_MODELS.get(type(obj))) is not None:
        return model.set_attribute(frame, obj, name, value)
    if isinstance(obj, (ListVariable, TupleVariable, DictVariable, SetVariable)) and \
            obj.python_type() not in _BUILTIN_CONTAINER_TYPES and hasattr(obj.python_type(), "__dict__") and \
            "__slots__" not in vars(obj.python_type()):
        obj.attrs[name] = value  # an instance of a list/tuple/dict subclass has a __dict__
        og.side_effects.mark_mutated(obj)  # one from outside gets it written back
        return None
    if isinstance(obj, FreshObjectVariable):
        hook = inspect.getattr_static(obj.cls, "__setattr__", None)
        if isinstance(hook, types.FunctionType):  # the class's own __setattr__ (it may call super's)
            owner = next(k for k in obj.cls.__mro__ if "__setattr__" in vars(k))  # (where another process finds it)
            call_python_function(frame, hook, [obj, const(name), value], {}, AttrSource(ConstSource(owner), "__setattr__"))
        else:
            store_fresh_attr(frame, obj, name, value)
        return
    if isinstance(obj, ObjectVariable) and type(obj.value) is types.ModuleType:  # `module.name = v`: its global
        og.side_effects.store_global(GlobalSource(obj.value.__dict__, name, False), value)
        return
    if isinstance(obj, ObjectVariable) and obj.source is not None and not isinstance(obj.value, (type, types.ModuleType)):
        value_obj = obj.value
        if isinstance(value_obj, torch.nn.Module):
            if isinstance(value, TensorVariable) and (name in value_obj._parameters or
                                                      isinstance(value.python_type(), torch.nn.Parameter)):
                raise Unsupported("assigning a parameter during capture")
            if name in value_obj._modules or name in value_obj._parameters:
                raise Unsupported("replacing a submodule or parameter during capture")
        elif _python_dunder(type(value_obj), "__setattr__"):
            raise Unsupported("setattr on an object with its own __setattr__")
        elif isinstance(value_obj, BaseException) and name in ("__cause__", "__context__"):
            _check_exception_link(name, value)  # then written back after the graph, as any attribute
        elif inspect.getattr_static(type(value_obj), name, None) is not None and \
                hasattr(type(inspect.getattr_static(type(value_obj), name)), "__set__"):
            raise Unsupported(f"setting descriptor attribute {name}")
        if (tracked := og.side_effects.instance_dicts.get(id(value_obj))) is not None:
            tracked.items[name] = value
            og.side_effects.mark_mutated(tracked)
            return
        og.side_effects.store_attr(obj, name, value)
        return
    if _made_exception(obj) and name == "__traceback__":
        set_traceback(og, obj.value, value)
        return
    if _made_exception(obj) and not _python_dunder(type(obj.value), "__setattr__") and \
            isinstance(value, (ConstantVariable, ObjectVariable)):
        _set_exception_attr(obj.value, name, value.value)
        return
    raise Unsupported(f"setting attribute {name!r} on {describe(obj)}")


def _check_exception_link(name, value):
    """`exc.__cause__ = value` on an existing exception: CPython checks the value at once (TypeError,
    which the program may catch); capture does too, before it defers the write to after the graph."""
    if isinstance(value, ConstantVariable) and value.value is None:
        return
    if isinstance(value, ObjectVariable) and isinstance(value.value, BaseException):
        return
    if isinstance(value, ConstantVariable):
        what = "cause" if name == "__cause__" else "context"
        e = TypeError(f"exception {what} must be None or derive from BaseException")
        raise Unsupported(str(e), python_exception=e)
    raise Unsupported(f"setting {name} of an exception to {describe(value)}", kind="unsupported_object")


def _made_exception(obj):
    """An exception object made during this capture (it exists nowhere else yet: the glue hands a
    fresh copy of it to each call), which capture may therefore change natively."""
    return isinstance(obj, ObjectVariable) and obj.source is None and isinstance(obj.value, BaseException)


def _set_exception_attr(exc, name, value):
    """`exc.name = value` run natively, as eager code would: __cause__/__context__ check their value
    (TypeError), `args` becomes a tuple, anything else lands in the exception's __dict__."""
    try:
        setattr(exc, name, value)
    except (TypeError, AttributeError) as e:
        raise Unsupported(f"setting {name} on an exception raised {type(e).__name__}: {e}", python_exception=e) from e


# ---- calls --------------------------------------------------------------------------------------
def call(frame, fn, args, kwargs):
    if isinstance(fn, MethodVariable):
        return _call_method_var(frame, fn, args, kwargs)
    if isinstance(fn, FunctionVariable):
        defaults = fn.defaults.items if isinstance(fn.defaults, TupleVariable) else \
            [const(d) for d in fn.defaults.value] if fn.defaults is not None else None
        kwdefaults = dict_items(frame, fn.kwdefaults) if fn.kwdefaults is not None else None
        return frame.inline_call(fn.code, fn.f_globals, args, kwargs, defaults, kwdefaults, fn.closure)
    if isinstance(fn, ExitVariable):
        fn.on_exit()
        return const(None)
    if isinstance(fn, RuntimeFunctionVariable):  # (guarded by its code: what it is, not which object)
        return _inline_function(frame, fn.fn, args, kwargs, fn.source)
    if isinstance(fn, (ObjectVariable, ConstantVariable)):
        return _call_value(frame, fn, args, kwargs)
    if (model := VARIABLE_MODELS.get(type(fn))) is not None:
        return model.call(frame, fn, args, kwargs)
    if isinstance(fn, FreshObjectVariable) and \
            isinstance(call_attr := inspect.getattr_static(fn.cls, "__call__", None), types.FunctionType):
        return call_python_function(frame, call_attr, [fn] + list(args), kwargs)  # an instance made in the frame
    if (call_method := python_special(frame, fn, "__call__", objects=False)) is not None:
        return call(frame, call_method, args, kwargs)  # an instance of a list/dict/tuple subclass with __call__
    raise Unsupported(f"calling {describe(fn)}")


def _call_method_var(frame, m, args, kwargs):
    obj, fn = m.obj, m.fn
    if isinstance(fn, str):
        if isinstance(obj, TensorVariable):
            return _tensor_method(frame, obj, fn, args, kwargs)
        return call_method(frame, obj, fn, args, kwargs)
    if isinstance(fn, (types.WrapperDescriptorType, types.MethodDescriptorType)):
        if fn is object.__init__:
            return const(None)
        if fn is object.__getattribute__ and isinstance(obj, ObjectVariable) and len(args) == 1:
            return _object_attr(frame, obj, const_value(args[0], "attribute name"), plain=True)
        if fn in _OBJECT_SLOTS and isinstance(obj, FreshObjectVariable):
            return _OBJECT_SLOTS[fn](frame, obj, const_value(args[0], "attribute name"), *args[1:])
        if fn.__objclass__ is dict and isinstance(obj, DictVariable):
            obj = dicts_own_receiver(obj, fn.__name__)
        view = readonly_dict_view(frame, obj, fn)
        if view is not None:
            return call_method(frame, view, fn.__name__, args, kwargs)
        if isinstance(obj, (ListVariable, TupleVariable, DictVariable, SetVariable)):
            return call_method(frame, obj, fn.__name__, args, kwargs)
        return call(frame, ObjectVariable(fn), [obj] + list(args), kwargs)
    if isinstance(fn, FunctionVariable):
        return call(frame, fn, [obj] + list(args), kwargs)
    return call_python_function(frame, fn, [obj] + list(args), kwargs)


def _store_and_return_none(frame, obj, name, value):
    store_fresh_attr(frame, obj, name, value)
    return const(None)


def _delete_and_return_none(frame, obj, name):
    delattr_var(frame, obj, name)
    return const(None)


# object's own attribute slots, called through super() from a class that overrides them
_OBJECT_SLOTS = {object.__getattribute__: fresh_attr, object.__setattr__: _store_and_return_none,
                 object.__delattr__: _delete_and_return_none}

_READONLY_DICT_METHODS = {"get", "keys", "values", "items", "__contains__", "__len__", "__getitem__", "copy"}


def dicts_own_receiver(d, name):
    """What dict's own method `name`, called unbound on the DictVariable `d` (`dict.copy(od)`), acts on:
    a copy or union of a subclass instance is a plain dict (taken in the instance's own order); an
    OrderedDict whose storage order differs from its own breaks where the method reads the storage."""
    if name in odict_order.STORAGE_READS and odict_order.differs(d):
        raise Unsupported(f"dict.{name} reads the storage order of an OrderedDict whose own order differs "
                          f"(the model follows its own order)")
    if name in ("copy", "__or__") and d.cls is not dict and issubclass(d.cls, dict):
        return DictVariable(d.items)
    return d


def readonly_dict_view(frame, obj, fn):
    """dict's own read-only methods on an existing dict subclass instance (a registry, a ModelOutput):
    a DictVariable over its current items, guarded on its keys."""
    if not (isinstance(obj, ObjectVariable) and isinstance(obj.value, dict) and obj.source is not None
            and fn.__name__ in _READONLY_DICT_METHODS and getattr(fn, "__objclass__", None) in (dict, collections.OrderedDict)):
        return None
    value = obj.value
    if not all(type(k) in (str, int) for k in value):
        return None
    if isinstance(value, collections.OrderedDict) and fn.__objclass__ is dict and fn.__name__ in odict_order.STORAGE_READS:
        if list(dict.keys(value)) != list(value):  # (the view below follows its own order)
            raise Unsupported(f"dict.{fn.__name__} reads the storage order of an OrderedDict whose own order differs")
        frame.og.guards.storage_order_match(obj.source, value)
    frame.og.guards.keys_match(obj.source, value)
    return DictVariable({k: frame.og.wrap(dict.__getitem__(value, k), ItemSource(obj.source, k)) for k in value})


def _refuse_new_leaf(frame, what, kwargs):
    """A tensor made with requires_grad=True is a new autograd leaf: graphs traced into aot (backward
    included) return plain tensors, so it is made outside the graph, as torch.compile does."""
    if "requires_grad" in kwargs and truth(frame, kwargs["requires_grad"]):
        raise Unsupported(f"{what}(requires_grad=True) makes a new autograd leaf")


@functools.cache
def _is_inplace_view_op(name):
    """Whether aten tags `name` as an in-place view op: it changes a tensor's sizes or strides in place
    (unsqueeze_, t_, transpose_, as_strided_, resize_as_, set_)."""
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return False
    return any(torch.Tag.inplace_view in getattr(packet, o).tags for o in packet.overloads())


def _refuse_input_metadata_change(t, name):
    """An in-place view op on a tensor from outside the frame (an argument, a module's parameter)
    changes that input's metadata: it runs between graphs, as torch.compile runs it, so the graph
    after it sees the input with its new sizes and strides."""
    if t.source is not None and _is_inplace_view_op(name):
        raise Unsupported(f"Tensor.{name}() changes the sizes or strides of a tensor from outside the frame",
                          kind="global_state")


def _tensor_method(frame, t, name, args, kwargs):
    _refuse_new_leaf(frame, f"Tensor.{name}", kwargs)
    _refuse_input_metadata_change(t, name)
    if name in ("item", "tolist") and not args and not kwargs and data_scalars.captures_scalars(frame):
        # numbers the graph computes: unbacked symbols in the ShapeEnv (their values are not known
        # at capture time, so a Python branch on them still breaks)
        return data_scalars.item(frame, t) if name == "item" else data_scalars.tolist(frame, t)
    if name in TENSOR_METHODS:
        return TENSOR_METHODS[name](frame, t, args, kwargs)
    if name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "data_ptr",
                "backward", "register_hook", "retain_grad", "__len__", "__iter__", "__array__"):
        if name == "__len__":
            return BUILTIN_HANDLERS[len](frame, [t], {})
        raise Unsupported(f"Tensor.{name}() needs the tensor's data in Python", kind="data_dependent")
    if name == "requires_grad_":  # a new autograd leaf, or a changed flag: made outside the graph (as
        raise Unsupported("Tensor.requires_grad_() changes what autograd tracks")  # torch.compile does)
    return frame.og.call_op("call_method", name, [t] + list(args), kwargs)


def call_python_function(frame, fn, args, kwargs, source=None):
    """Inline a plain Python function (existing object); `source`: where the frame found it, when no
    module holds it by name (the function inside a decorator's closure), so that its defaults and
    cells are read, and guarded, where another process finds them too."""
    if is_disabled_function(fn):
        raise Unsupported(f"call to kiln.disable'd function {fn.__qualname__}", kind="disabled_function")
    handler = BUILTIN_HANDLERS.get(fn)  # a Python function capture models instead of inlining
    if handler is not None:
        return handler(frame, args, kwargs)
    if getattr(fn, "_dynamo_marked_constant", False):  # torch._dynamo.assume_constant_result's mark (what
        return fold_natively(frame.og, fn, args, kwargs)  # transformers' install probes carry): run it, a constant
    mod = getattr(fn, "__module__", None) or ""
    if mod.split(".")[0] in ("logging", "warnings"):
        raise Unsupported(f"call to {mod}.{fn.__qualname__} (logging/warnings have effects outside the graph)",
                          kind="print_or_log")
    if hasattr(fn, "__kiln_orig__"):
        fn, source = fn.__kiln_orig__, None
    if not isinstance(fn, types.FunctionType):
        return call(frame, frame.og.wrap(fn, None, guard=False), args, kwargs)
    if fn is _MODULE_GETATTR and len(args) == 2 and isinstance(args[0], ObjectVariable) and not kwargs:
        return module_store_attr(frame, args[0], const_value(args[1], "attribute name"))
    if _is_torch_op(fn) and not _passes_python_callable(args, kwargs):
        return call_torch(frame, fn, args, kwargs)
    return _inline_function(frame, fn, args, kwargs, source if source is not None and held_weakly(fn) else None)


def _passes_python_callable(args, kwargs):
    """A Python callable among the arguments: a graph node cannot hold one, so a torch function given
    one (torch.fx.node.map_aggregate(x, f)) is followed as Python code instead."""
    return any(isinstance(a, (FunctionVariable, MethodVariable)) or
               isinstance(a, ObjectVariable) and callable(a.value) and not is_scalar_type(a.value)
               for a in _leaves(args, kwargs))


def _inline_function(frame, fn, args, kwargs, source=None):
    """Inline `fn`'s code. Its defaults and closure cells are read, and guarded, through `source` (a
    function made at run time, guarded by its code) or else through the object itself (guarded by
    identity), so `fn.__defaults__ = ...` is seen by the guards."""
    og = frame.og
    base = source if source is not None else ConstSource(fn)
    defaults = None
    if fn.__defaults__:
        src = AttrSource(base, "__defaults__")
        defaults = [og.wrap(d, ItemSource(src, i)) for i, d in enumerate(fn.__defaults__)]
    kwdefaults = None
    if fn.__kwdefaults__:
        src = AttrSource(base, "__kwdefaults__")
        kwdefaults = {k: og.wrap(d, ItemSource(src, k)) for k, d in fn.__kwdefaults__.items()}
    code = original_code(fn.__code__)  # a function made by a frame that ran rewritten (eager_frames)
    closure = AttrSource(base, "__closure__")  # (a cell by where it is: another process finds it there too)
    cells = [RealCell(c, AttrSource(ItemSource(closure, i), "cell_contents"))
             for i, c in enumerate(fn.__closure__ or ())]
    return frame.inline_call(code, fn.__globals__, args, kwargs, defaults, kwdefaults, cells)


def _is_torch_op(fn):
    """Functions that go into the graph as one call instead of being inlined."""
    mod = getattr(fn, "__module__", None) or ""
    if isinstance(fn, types.FunctionType):
        if not mod.startswith("torch"):
            return False
        if mod.startswith(("torch.nn.modules", "torch.utils", "torch.autograd", "torch.optim", "torch.distributions",
                           "torch.distributed")):  # Python over ops and process groups: followed, not one node
            return False
        return "." not in fn.__qualname__ or mod == "torch._tensor"
    if isinstance(fn, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
        objclass = getattr(fn, "__objclass__", None)
        if objclass is not None:
            return objclass in (torch._C.TensorBase, torch.Tensor)
        return mod.startswith("torch")
    return isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))


# "Am I being compiled?" queries. Libraries (transformers, torchvision) take compile-friendly paths
# when these say yes, and capture is compiling; they are matched by name so kiln never imports
# torch's own compiler package.
_COMPILING_QUERIES = {("torch.compiler", "is_compiling"), ("torch.compiler", "is_dynamo_compiling"),
                      ("torch._dynamo.external_utils", "is_compiling"), ("torch._utils", "is_compiling")}
# TorchScript's hooks, as seen from code that is not being scripted or traced
_SCRIPTING_ANSWERS = {("torch._jit_internal", "is_scripting"): lambda args, kwargs: const(False),
                      ("torch.jit._trace", "is_tracing"): lambda args, kwargs: const(False),
                      ("torch.jit", "annotate"): lambda args, kwargs: (list(args) + list(kwargs.values()))[1]}


def call_torch(frame, fn, args, kwargs):
    og = frame.og
    if fn is torch.is_grad_enabled:
        return const(og.grad_enabled)
    name_key = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))
    if name_key in _COMPILING_QUERIES:
        return const(True)
    if name_key in _SCRIPTING_ANSWERS:
        return _SCRIPTING_ANSWERS[name_key](args, kwargs)
    name = getattr(fn, "__name__", "")
    has_tensor = any(isinstance(a, TensorVariable) for a in _leaves(args, kwargs))
    if not has_tensor and any(w in name.lower() for w in _STATEFUL_WORDS):
        raise Unsupported(f"torch.{name} changes global state", kind="global_state")
    if _passes_python_callable(args, kwargs):
        raise Unsupported(f"torch function {name} called with a Python function argument")
    _refuse_new_leaf(frame, f"torch.{name}", kwargs)
    if args and isinstance(args[0], TensorVariable):  # Tensor.unsqueeze_(x, 0)
        _refuse_input_metadata_change(args[0], name)
    if not has_tensor:
        # a query (dispatch state, flags) must see the real state, not capture's fake mode; a factory
        # (torch.zeros) must become a node: the fake run tells which, without touching real RNG state
        try:
            result = og.call_op("call_function", fn, list(args), kwargs)
        except Unsupported:
            return _fold_query(og, fn, args, kwargs)
        return _fold_query(og, fn, args, kwargs) if isinstance(result, ConstantVariable) else result
    return og.call_op("call_function", fn, list(args), kwargs)


# torch functions of constant arguments whose answer cannot change between calls
_PURE_TORCH = {torch.promote_types, torch.can_cast, torch.broadcast_shapes, torch.is_tensor, torch.is_storage,
               torch.typename}


def _fold_query(og, fn, args, kwargs):
    """A torch call without tensors answered now (torch.get_default_dtype(), torch.get_num_threads()):
    unless it is pure, a guard asks it again on every call, so a changed global setting recompiles."""
    result = fold_natively(og, fn, args, kwargs)
    if _key(fn) in _PURE_TORCH:
        return result
    value = const_value(result, f"the answer of {getattr(fn, '__name__', fn)}")
    g = og.guards
    call = f"{g.const(fn, 'Q')}(*{g.const(const_value(make_tuple(list(args))), 'QA')}, " \
           f"**{g.const({k: const_value(v) for k, v in kwargs.items()}, 'QK')})"
    g.add(None, f"{call} == {g.const(value, 'QR')}", f"{getattr(fn, '__qualname__', fn)}(...) == {value!r}")
    return result


def _leaves(args, kwargs):
    out = []

    def visit(v):
        if isinstance(v, (ListVariable, TupleVariable, SetVariable)):
            for i in v.items:
                visit(i)
        elif isinstance(v, DictVariable):
            for i in v.items.values():
                visit(i)
        else:
            out.append(v)
    for a in list(args) + list(kwargs.values()):
        visit(a)
    return out


def _call_value(frame, fn_var, args, kwargs):
    og = frame.og
    fn = fn_var.value
    if is_disabled_function(fn):
        raise Unsupported(f"call to kiln.disable'd function {getattr(fn, '__qualname__', fn)}",
                          kind="disabled_function")
    if hasattr(fn, "__kiln_orig__"):
        fn = fn.__kiln_orig__
        if isinstance(fn, torch.nn.Module):
            return call_module(frame, og.wrap(fn, AttrSource(fn_var.source, "__kiln_orig__")
                                              if fn_var.source else None), args, kwargs)
    if isinstance(fn, torch.nn.Module):
        own_call = inspect.getattr_static(type(fn), "__call__")
        if own_call is not torch.nn.Module.__call__ and isinstance(own_call, types.FunctionType):
            return call_python_function(frame, own_call, [fn_var] + list(args), kwargs)  # a subclass's __call__
        return call_module(frame, fn_var, args, kwargs)
    if isinstance(fn, types.MethodType):
        self_var = og.wrap(fn.__self__, AttrSource(fn_var.source, "__self__") if fn_var.source else None)
        func = fn.__func__
        if isinstance(func, types.FunctionType):
            return call_python_function(frame, func, [self_var] + list(args), kwargs)
        return call(frame, og.wrap(func, None, guard=False), [self_var] + list(args), kwargs)
    if (handler := BUILTIN_HANDLERS.get(_c_classmethod(fn))) is not None:  # cls.m, m a C classmethod
        cls_var = og.wrap(fn.__self__, AttrSource(fn_var.source, "__self__") if fn_var.source else None)
        return handler(frame, [cls_var] + list(args), kwargs)
    handler = BUILTIN_HANDLERS.get(_key(fn))
    if handler is not None:
        return handler(frame, args, kwargs)
    module = getattr(fn, "__module__", None)
    if isinstance(module, str) and (model := MODULE_MODELS.get(module.partition(".")[0])) is not None:
        return model.call(frame, fn_var, args, kwargs)
    if isinstance(fn, (types.WrapperDescriptorType, types.MethodDescriptorType)) and args and \
            getattr(fn, "__objclass__", None) in (list, tuple, dict, set) and \
            isinstance(args[0], (ListVariable, TupleVariable, DictVariable, SetVariable)):
        return _call_method_var(frame, MethodVariable(fn, args[0]), args[1:], kwargs)  # tuple.__getitem__(self, i)
    if isinstance(fn, NativeExit):  # the end of a profiler block a break cut in two: after the graph call
        og.native_exits.append(fn_var)
        return const(None)
    if isinstance(fn, GradModeExit):  # the end of a grad-mode block a break cut in two
        if fn_var.source is not None:
            og.guards.id_match(fn_var.source, fn)
        og.set_grad_enabled(fn.mode)
        return const(None)
    if isinstance(fn, types.FunctionType):
        return call_python_function(frame, fn, args, kwargs, fn_var.source)
    if type(fn) is torch._C.ScriptFunction and \
            isinstance(python := getattr(fn, "_torchdynamo_inline", None), types.FunctionType):
        return call_python_function(frame, python, args, kwargs)  # @torch.jit.script: the Python it compiled
    if _is_torch_op(fn):
        return call_torch(frame, fn, args, kwargs)
    if isinstance(fn, type):
        return _construct(frame, fn_var, fn, args, kwargs)
    if _key(fn) in _OPERATOR_FUNCTIONS and not all(isinstance(a, ConstantVariable) for a in args) and not kwargs:
        return apply_operator(frame, fn, list(args))  # operator.or_(a, b) is `a | b`, on containers too
    if getattr(fn, "__module__", None) in ("math", "operator", "_operator", "cmath") and \
            isinstance(fn, (types.BuiltinFunctionType, types.FunctionType)):
        if any(isinstance(a, TensorVariable) for a in _leaves(args, kwargs)):
            if getattr(fn, "__module__", None) in ("operator", "_operator"):
                return apply_operator(frame, fn, list(args))
            raise Unsupported(f"{fn.__name__} on a tensor needs its data in Python")
        return fold_natively(og, fn, args, kwargs)
    if isinstance(fn, operator.itemgetter):
        items = [getitem(frame, args[0], const(k)) for k in fn.__reduce__()[1]]
        return items[0] if len(items) == 1 else make_tuple(items)
    if isinstance(fn, operator.attrgetter):
        items = []
        for path in fn.__reduce__()[1]:
            v = args[0]
            for part in path.split("."):
                v = getattr_var(frame, v, part)
            items.append(v)
        return items[0] if len(items) == 1 else make_tuple(items)
    if isinstance(fn, functools.partial):
        src = fn_var.source
        pre = [og.wrap(a, ItemSource(AttrSource(src, "args"), i) if src else None)
               for i, a in enumerate(fn.args)]
        kw = {k: og.wrap(v, ItemSource(AttrSource(src, "keywords"), k) if src else None)
              for k, v in fn.keywords.items()}
        func = og.wrap(fn.func, AttrSource(src, "func") if src else None)
        return call(frame, func, pre + list(args), {**kw, **kwargs})
    og.guards.class_unchanged(type(fn))
    call_attr = inspect.getattr_static(type(fn), "__call__", None)
    if isinstance(call_attr, types.FunctionType):
        return call_python_function(frame, call_attr, [fn_var] + list(args), kwargs)
    if (model := TYPE_MODELS.get(type(fn))) is not None:
        return model.call(frame, fn_var, args, kwargs)
    raise Unsupported(f"call to {describe(fn_var)} (not Python code kiln can follow)", kind="unsupported_call")


# the operator module's functions that are an operator of the language: called on Variables, they are
# that operator (apply_operator), so containers, views and user objects get their own semantics
_OPERATOR_FUNCTIONS = frozenset(list(_REFLECTED) + list(_INPLACE_TO_BINARY) + [
    operator.not_, operator.truth, operator.is_, operator.is_not, operator.contains, operator.getitem,
    operator.neg])


def _c_classmethod(fn):
    """The classmethod descriptor of a C classmethod bound to a class (`cls.m` -> the `m` its class
    defines, as a handler is keyed: torch 2.14's autograd.Function.apply), else None."""
    if not isinstance(fn, types.BuiltinMethodType) or not isinstance(fn.__self__, type):
        return None
    raw = inspect.getattr_static(fn.__self__, fn.__name__, None)
    return raw if isinstance(raw, types.ClassMethodDescriptorType) else None


def _key(fn):
    try:
        hash(fn)
        return fn
    except TypeError:
        return None


def fold_natively(og, fn, args, kwargs):
    try:
        values = [const_value(a) for a in args]
        kw = {k: const_value(v) for k, v in kwargs.items()}
        return result_var(og, fn(*values, **kw))
    except Unsupported:
        raise
    except Exception as e:
        raise Unsupported(f"{getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}", python_exception=e) from e


def _construct(frame, cls_var, cls, args, kwargs):
    og = frame.og
    if (make := CONSTRUCTORS.get(cls) or CONSTRUCTORS.get(type(cls))) is not None:  # the class, or its metaclass
        return make(frame, args, kwargs) if cls in CONSTRUCTORS else make(frame, cls, args, kwargs)
    if cls is torch.set_grad_enabled:
        return _set_grad_enabled(frame, args, kwargs)
    if issubclass(cls, torch.amp.autocast_mode.autocast):
        mode = fold_natively(og, cls, args, kwargs).value  # validates the arguments as torch does
        return AutocastVariable((mode.device, mode.fast_dtype, mode._enabled, mode._cache_enabled), cls)
    if issubclass(cls, torch.nn.Module):
        return _construct_module(frame, cls, args, kwargs)
    if issubclass(cls, BaseException):
        return fold_natively(og, cls, args, kwargs)
    if cls in (operator.itemgetter, operator.attrgetter, functools.partial):
        return fold_natively(og, cls, args, kwargs)
    if cls.__module__ == "builtins" or cls.__module__.startswith("torch") and not _python_library_class(cls):
        if cls in (torch.Size, torch.device, torch.dtype, torch.finfo, torch.iinfo) or cls.__module__ == "builtins":
            return fold_natively(og, cls, args, kwargs)
        raise Unsupported(f"constructing {cls.__qualname__}")
    for base in cls.__mro__[1:]:  # a subclass of list/tuple/dict (container_subclasses)
        if (make := SUBCLASS_CONSTRUCTORS.get(base)) is not None:
            if (made := make(frame, cls, args, kwargs)) is not None:
                return made
            break
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        values = dict(zip(cls._fields, args))
        values.update(kwargs)
        for name, default in cls._field_defaults.items():
            values.setdefault(name, wrap_const(og, default))
        if set(values) != set(cls._fields):
            raise Unsupported(f"bad arguments to namedtuple {cls.__qualname__}")
        return TupleVariable([values[f] for f in cls._fields], cls=cls)
    if _is_model_output(cls):
        return _model_output(frame, cls, args, kwargs)
    if issubclass(cls, (list, dict, set, tuple)) or type(cls) is not type and not issubclass(type(cls), type):
        raise Unsupported(f"constructing {cls.__qualname__}")
    og.guards.class_unchanged(cls)  # its __init__, __new__ and methods as they are now
    if cls.__new__ is not object.__new__:
        raise Unsupported(f"constructing {cls.__qualname__} (custom __new__)")
    obj = FreshObjectVariable(cls)
    init = inspect.getattr_static(cls, "__init__", None)
    if isinstance(init, types.FunctionType):
        call_python_function(frame, init, [obj] + list(args), kwargs)
    elif args or kwargs:
        raise Unsupported(f"constructing {cls.__qualname__} with arguments")
    return obj


def _python_library_class(cls):
    """A class of torch's written in Python that capture follows like user code (torch.distributions,
    torch.testing's comparison pairs, torch.utils._pytree's TreeSpec that tree_flatten makes)."""
    return cls.__module__.startswith(("torch.distributions.", "torch.testing.", "torch.utils._pytree"))


def _construct_module(frame, cls, args, kwargs):
    """`nn.ReLU()`, `nn.Softmax(dim=-1)`, `nn.Dropout(p)` in the frame: a module without parameters or
    buffers, made natively once from arguments known exactly and reused by every call (it holds no
    state a call could change). One that has parameters, or draws random numbers to make them, would
    differ on every eager call: that breaks the graph."""
    try:
        values = [const_value(a, "an argument of a module made in the frame") for a in args]
        kw = {k: const_value(v, "an argument of a module made in the frame") for k, v in kwargs.items()}
    except Unsupported:  # built from values only the frame knows: followed through the class's __init__
        made = SUBCLASS_CONSTRUCTORS[torch.nn.Module](frame, cls, args, kwargs)  # (fresh_modules)
        if made is None:
            raise
        return made
    rng = torch.random.get_rng_state()
    try:
        module = cls(*values, **kw)
    except Exception as e:
        raise Unsupported(f"creating module {cls.__qualname__} raised {type(e).__name__}: {e}",
                          python_exception=e) from e
    if next(module.parameters(), None) is not None or next(module.buffers(), None) is not None or \
            not torch.equal(rng, torch.random.get_rng_state()):
        torch.random.set_rng_state(rng)
        raise Unsupported(f"creating module {cls.__qualname__} (with parameters or buffers) inside compiled code")
    frame.og.guards.const(module, "MADE")  # owned by the entry (its guards hold what they check weakly)
    return frame.og.wrap(module, ConstSource(module))


def _is_model_output(cls):
    return dataclasses.is_dataclass(cls) and issubclass(cls, dict) and \
        any(c.__name__ == "ModelOutput" and c.__module__.startswith("transformers") for c in cls.__mro__)


def _model_output(frame, cls, args, kwargs):
    """transformers' ModelOutput(...): its __post_init__ keys the fields that are not None."""
    fields = [f.name for f in dataclasses.fields(cls)]
    if len(args) > len(fields) or any(k not in fields for k in kwargs):
        raise Unsupported(f"unexpected arguments to {cls.__qualname__}")
    values = dict(zip(fields, args))
    values.update(kwargs)
    for f in dataclasses.fields(cls):
        if f.name not in values:
            if f.default is dataclasses.MISSING:
                raise Unsupported(f"{cls.__qualname__} needs field {f.name}")
            values[f.name] = wrap_const(frame.og, f.default)
    first = values[fields[0]]
    others_none = all(isinstance(values[f], ConstantVariable) and values[f].value is None for f in fields[1:])
    if others_none and not isinstance(first, TensorVariable):
        raise Unsupported(f"{cls.__qualname__} built from a mapping or iterator")
    return DataDictVariable(cls, {f: values[f] for f in fields})


def _set_grad_enabled(frame, args, kwargs):
    mode = bool(const_value(args[0] if args else kwargs["mode"], "set_grad_enabled mode"))
    prior = frame.og.grad_enabled
    frame.og.set_grad_enabled(mode)  # takes effect now, with or without a with-block
    return GradModeVariable(mode, torch.set_grad_enabled, prior)


def _initialize_lazy_module(og, mod, args, kwargs):
    """A lazy module (nn.LazyLinear) makes its parameters from the shapes of its first inputs, as eager
    does on the first call: natively, from the fake inputs' shapes, before capture reads the module
    (which then has real parameters, and is guarded as any other)."""
    fake_args, fake_kwargs = to_fake((list(args), dict(kwargs)))
    try:
        mod._infer_parameters(mod, tuple(fake_args), fake_kwargs)
    except Exception as e:
        raise Unsupported(f"initializing lazy module {type(mod).__qualname__} raised {type(e).__name__}: {e}") from e


def guard_no_global_module_hooks(og):
    """A module call runs as its forward alone only while no global module hook is registered."""
    if not og.hook_globals_guarded:
        mm = og.guards.const(_MODULE_MOD, "MM")
        og.guards.add(None, f"not ({mm}._global_forward_hooks or {mm}._global_forward_pre_hooks or "
                            f"{mm}._global_backward_hooks or {mm}._global_backward_pre_hooks)",
                      "no global module hooks")
        og.hook_globals_guarded = True
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    if any(getattr(_MODULE_MOD, "_global" + h) for h in hooks):
        raise Unsupported("global module hooks")


def call_module(frame, mod_var, args, kwargs):
    """`module(*args)`: forward pre-hooks, forward, forward hooks — guarded on the hook dicts."""
    og, mod = frame.og, mod_var.value
    if mod_var.source is None:
        raise Unsupported("calling a module with no known origin")
    if isinstance(mod, torch.nn.modules.lazy.LazyModuleMixin) and hasattr(mod, "_initialize_hook"):
        _initialize_lazy_module(og, mod, args, kwargs)
    og.guards.class_unchanged(type(mod))
    call_fn = inspect.getattr_static(type(mod), "__call__", None)
    if call_fn is not _MODULE_CALL:  # the class's own __call__ (`return 5 * self.forward(x)`) runs
        if isinstance(call_fn, types.FunctionType):
            return call_python_function(frame, call_fn, [mod_var] + list(args), kwargs)
        raise Unsupported(f"{type(mod).__qualname__}.__call__ is not a Python function")
    if inspect.getattr_static(type(mod), "_call_impl", None) is not _MODULE_CALL_IMPL:
        raise Unsupported(f"{type(mod).__qualname__} overrides nn.Module._call_impl")
    guard_no_global_module_hooks(og)
    if mod._backward_hooks or mod._backward_pre_hooks:
        raise Unsupported("module backward hooks")
    pre, post = mod._forward_pre_hooks, mod._forward_hooks
    # the instance may override forward (mod.forward = ...): getattr_var reads and guards it then
    # (a guard of its own: the same check guarding the forward it reads is then this one, not a second)
    own = "forward" in mod.__dict__
    og.guards.in_instance_dict(mod_var.source, "forward", own,
                               f"{mod_var.source!r}.forward {'is set on the instance' if own else 'comes from its class'}")
    if not (pre or post):  # the common case: one guard
        og.guards.add(mod_var.source, "not (v._forward_hooks or v._forward_pre_hooks or v._backward_hooks or "
                                      "v._backward_pre_hooks)", f"{mod_var.source!r} has no hooks")
    else:
        og.guards.add(mod_var.source, "not (v._backward_hooks or v._backward_pre_hooks)",
                      f"{mod_var.source!r} has no backward hooks")
        for name in ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                     "_forward_hooks_with_kwargs", "_forward_hooks_always_called"):
            vals = og.guards.const(tuple(getattr(mod, name).items()), "HOOKS")
            og.guards.add(mod_var.source, f"tuple(v.{name}.items()) == {vals}", f"{mod_var.source!r}.{name} unchanged")
    args = list(args)
    def hook_var_of(store, hook_id):  # hooks are reloaded by source, so a stateful hook object is guarded
        return og.wrap(getattr(mod, store)[hook_id], ItemSource(AttrSource(mod_var.source, store), hook_id))
    for hook_id, hook in pre.items():
        hook_var = hook_var_of("_forward_pre_hooks", hook_id)
        if hook_id in mod._forward_pre_hooks_with_kwargs:
            res = call(frame, hook_var, [mod_var, TupleVariable(args), DictVariable(kwargs)], {})
            if not is_same(res, const(None)):
                new_args, new_kwargs = unpack_iterable(frame, res)
                args, kwargs = unpack_iterable(frame, new_args), dict_items(frame, new_kwargs)
        else:
            res = call(frame, hook_var, [mod_var, TupleVariable(args)], {})
            if not is_same(res, const(None)):
                args = unpack_iterable(frame, res) if isinstance(res, (TupleVariable,)) or \
                    (isinstance(res, ConstantVariable) and type(res.value) is tuple) else [res]
    forward = getattr_var(frame, mod_var, "forward")
    result = call(frame, forward, args, kwargs)
    for hook_id, hook in post.items():
        hook_var = hook_var_of("_forward_hooks", hook_id)
        if hook_id in mod._forward_hooks_with_kwargs:
            res = call(frame, hook_var, [mod_var, TupleVariable(args), DictVariable(kwargs), result], {})
        else:
            res = call(frame, hook_var, [mod_var, TupleVariable(args), result], {})
        if not is_same(res, const(None)):
            result = res
    return result


# ---- methods of Python containers and constants --------------------------------------------------
def call_method(frame, obj, name, args, kwargs):
    og = frame.og
    if isinstance(obj, HandlerVariable):
        return obj.call_method(frame, name, args, kwargs)
    if (model := model_of(obj) or VARIABLE_MODELS.get(type(obj))) is not None:
        return model.call_method(frame, obj, name, args, kwargs)
    if name in _ITERATION_METHODS and not args and not kwargs:  # `range(5).__iter__()`, `it.__next__()`
        return _ITERATION_METHODS[name](frame, obj)
    for cls, method in CONTAINER_METHODS.items():  # list, dict, set: python_builtins
        if isinstance(obj, cls):
            return method(frame, obj, name, args, kwargs)
    if isinstance(obj, TupleVariable) and hasattr(obj.cls, "_fields") and name in ("_replace", "_asdict"):
        fields = dict(zip(obj.cls._fields, obj.items))
        if name == "_asdict":
            return DictVariable(fields)
        if any(k not in fields for k in kwargs):
            raise Unsupported(f"{obj.cls.__qualname__}._replace got unexpected fields")
        fields.update(kwargs)
        return TupleVariable(list(fields.values()), cls=obj.cls)
    if isinstance(obj, TupleVariable) and obj.cls is torch.Size and name == "numel":
        return BUILTIN_HANDLERS[math.prod](frame, [obj], {})  # symbolic sizes stay symbolic
    if isinstance(obj, TupleVariable):
        if name in ("index", "count", "__len__", "__contains__", "__getitem__"):
            if name == "__getitem__":
                return getitem(frame, obj, args[0], builtin=True)
            return fold_natively(og, getattr(const_value(obj), name), args, kwargs)
        raise Unsupported(f"{type(obj).__name__}.{name}")
    if isinstance(obj, ConstantVariable):
        return fold_natively(og, getattr(obj.value, name), args, kwargs)
    if name == "__delitem__" and isinstance(obj, TensorVariable):
        raise Unsupported("del on a tensor item")
    raise Unsupported(f"method {name} of {describe(obj)}")


def _dunder_next(frame, it):
    if not isinstance(it, BaseIterator):
        raise Unsupported(f"__next__ of {describe(it)}")
    return BUILTIN_HANDLERS[next](frame, [it], {})


_ITERATION_METHODS = {"__iter__": get_iter, "__reversed__": get_reversed, "__next__": _dunder_next}


def is_mapping_object(v):
    """An object (not a dict capture tracks) with the mapping protocol: keys() and [k]."""
    return isinstance(v, (ObjectVariable, FreshObjectVariable)) and hasattr(v.python_type(), "keys") and \
        hasattr(v.python_type(), "__getitem__")


def mapping_items(frame, v):
    """The (key -> Variable) items of what dict(v) / d.update(v) accepts: a dict, a mapping object with
    keys() and [k], or an iterable of key/value pairs."""
    if isinstance(v, DictVariable):
        return dict(v.items)
    if (read := getattr(model_of(v), "mapping_items", None)) is not None:  # a model's own reading
        return read(frame, v)
    if isinstance(v, ConstantVariable) and isinstance(v.value, dict):
        return dict_items(frame, v)
    if is_mapping_object(v):
        keys = unpack_iterable(frame, call(frame, getattr_var(frame, v, "keys"), [], {}))
        return {dict_key(k): getitem(frame, v, k) for k in keys}
    items = {}
    for i, pair in enumerate(unpack_iterable(frame, v)):
        parts = unpack_iterable(frame, pair)
        if len(parts) != 2:  # CPython's words
            e = ValueError(f"dictionary update sequence element #{i} has length {len(parts)}; 2 is required")
            raise Unsupported(f"ValueError: {e}", python_exception=e)
        k, value = parts
        items[dict_key(k)] = value
    return items


def _object_slot_call(slot):
    """object.__setattr__(obj, name, value) and its siblings called directly (a frozen dataclass's
    __init__ does so) on an object made in the frame."""
    def handler(frame, args, kwargs):
        if not args or not isinstance(args[0], FreshObjectVariable):
            raise Unsupported(f"{slot.__qualname__} on {describe(args[0]) if args else 'nothing'}")
        return _OBJECT_SLOTS[slot](frame, args[0], const_value(args[1], "attribute name"), *args[2:])
    return handler


BUILTIN_HANDLERS.update({slot: _object_slot_call(slot) for slot in _OBJECT_SLOTS})
