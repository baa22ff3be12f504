"""User subclasses of list, tuple, dict (OrderedDict), set and frozenset: instances made in the frame
(through the class, a Python __new__ calling super().__new__, or `tuple.__new__(cls, items)` directly)
and instances passed in. Their storage is the base's, so they are ListVariable/TupleVariable/DictVariable/
SetVariable of the subclass: the subclass's own Python methods run over them (objects.python_special),
the base's C methods are modelled (a set operation on a subclass gives a plain set, as CPython's do). One passed in is read, guarded and written back through the base's own methods, never
its overrides (`list.__getitem__(v, i)`, `list.__len__(v)`), and its instance __dict__ comes along.
Registers into objects (SUBCLASS_CONSTRUCTORS), graph_builder (SUBCLASS_WRAPPERS),
python_builtins (BUILTIN_HANDLERS) and glue (MUTATION_WRITERS)."""
import collections
import inspect
import types

from kiln.capture import glue, graph_builder, objects, odict_order
from kiln.capture.objects import (call_method, call_python_function, const_value, make_tuple, new_set,
                                  unpack_iterable)
from kiln.capture.python_builtins import BUILTIN_HANDLERS
from kiln.capture.sources import AttrSource, Source
from kiln.capture.variables import ConstantVariable, DictVariable, ListVariable, SetVariable, TupleVariable, is_constant
from kiln.exc import Unsupported

_BASES = (list, tuple, dict, collections.OrderedDict, set, frozenset)
_IMMUTABLE = (tuple, frozenset)  # items fixed by __new__; __init__ is object's
_SAME_NEW = {dict: collections.OrderedDict}  # OrderedDict.__new__ is dict.__new__
_HEAP_TYPE = 1 << 9


def storage_base(cls):
    """The builtin container a class stores its items in, when capture models its subclasses: list,
    tuple, dict, OrderedDict, set or frozenset (a defaultdict's or deque's subclass: None)."""
    for klass in cls.__mro__:
        if klass in _BASES:
            return klass
        if klass in (collections.defaultdict, collections.deque) or \
                not klass.__flags__ & _HEAP_TYPE and klass is not object:
            return None
    return None


def _plain_subclass(cls):
    """A heap subclass whose attribute protocol and slots are the ordinary ones."""
    base = storage_base(cls)
    if base is None or cls is base or not cls.__flags__ & _HEAP_TYPE:
        return None
    for klass in cls.__mro__:
        if klass is base:
            break
        own = vars(klass)
        if any(name in own for name in ("__setattr__", "__getattribute__", "__delattr__")) or own.get("__slots__"):
            return None
    return base


# ---- made in the frame ------------------------------------------------------------------------------
def _empty(cls, base, items=()):
    if base is tuple:
        return TupleVariable(list(items), cls=cls)
    if base in (set, frozenset):
        var = new_set(list(items))
        var.cls = cls
        return var
    return ListVariable(list(items), cls=cls) if base is list else DictVariable({}, cls=cls)


def construct(frame, cls, args, kwargs):
    """`cls(*args, **kwargs)`: the class's __new__ (a Python one, or the base's), then its __init__
    when __new__ gave an instance of cls, as type.__call__ does."""
    base = _plain_subclass(cls)
    if base is None or (hasattr(cls, "_fields") and not _python_new(cls)):
        return None
    new = _python_new(cls)
    if new is not None:
        var = call_python_function(frame, new, [frame.og.wrap(cls, None, guard=False)] + list(args), kwargs)
        if not issubclass(var.python_type(), cls):
            return var
    else:
        if base in _IMMUTABLE and kwargs:
            e = TypeError(f"{base.__name__}() takes no keyword arguments")
            raise Unsupported(f"{cls.__qualname__}() takes no keyword arguments", python_exception=e)
        var = _empty(cls, base, unpack_iterable(frame, args[0]) if base in _IMMUTABLE and args else ())
    init = inspect.getattr_static(cls, "__init__", None)
    if isinstance(init, types.FunctionType):
        call_python_function(frame, init, [var] + list(args), kwargs)
    elif base not in _IMMUTABLE:
        call_method(frame, var, "__init__", list(args), kwargs)
    return var


def _python_new(cls):
    """The Python __new__ a class (below its container base or namedtuple) defines, or None."""
    raw = inspect.getattr_static(cls, "__new__")
    fn = raw.__func__ if isinstance(raw, staticmethod) else raw
    if not isinstance(fn, types.FunctionType):
        return None
    named = next((k for k in cls.__mro__ if "_fields" in vars(k)), None)
    if named is not None and vars(named).get("__new__") is raw:
        return None  # the namedtuple's own generated __new__: objects makes those directly
    return fn


def _base_new(base):
    """`tuple.__new__(cls, items)`, `frozenset.__new__(cls, items)`, `list.__new__(cls)`,
    `dict.__new__(cls)`, `set.__new__(cls)`: an instance of `cls` (not initialised: __init__ is
    type.__call__'s business)."""
    def handler(frame, args, kwargs):
        cls = const_value(args[0], f"the class given to {base.__name__}.__new__")
        items = unpack_iterable(frame, args[1]) if base in _IMMUTABLE and len(args) > 1 else []
        if cls is base or cls is _SAME_NEW.get(base):
            return make_tuple(items) if base is tuple else _empty(cls, base, items)
        if not isinstance(cls, type) or _plain_subclass(cls) not in (base, _SAME_NEW.get(base)):
            raise Unsupported(f"{base.__name__}.__new__({getattr(cls, '__qualname__', cls)})")
        return _empty(cls, base, items)
    return handler


# ---- passed in ----------------------------------------------------------------------------------
class BaseItemSource(Source):
    """`base.__getitem__(obj, key)`: an item of a container subclass, read past its overrides."""

    def __init__(self, base_source, index, via):
        self.base, self.index, self.via = base_source, index, via

    def expr(self, ctx):
        literal = type(self.index) in (int, str, bytes, bool, type(None))
        key = repr(self.index) if literal else ctx.const(self.index, "KEY")
        return f"{ctx.const(self.via, 'BASE')}.__getitem__({ctx.sub(self.base)}, {key})"

    def key(self):
        return ("baseitem", self.base.key(), self.index, id(self.via))

    def __repr__(self):
        return f"{self.base!r}[{self.index!r}]"


def wrap_instance(og, value, source, guard):
    """An instance of a list/tuple/dict subclass from outside: its items and __dict__ as Variables,
    guarded on its type, length or keys (read with the base's methods) and __dict__ keys."""
    cls = type(value)
    base = _plain_subclass(cls)
    if base is None or source is None or hasattr(value, "_fields"):
        return None
    if base in (set, frozenset):
        return _wrap_set(og, value, source, guard, base)
    if base in (dict, collections.OrderedDict) and not all(graph_builder._stable_key(k) for k in base.keys(value)):
        return None
    g = og.guards if guard else None
    via = dict if base is collections.OrderedDict else base  # OrderedDict reads its items with dict's lookup
    if g:
        b, t = g.const(base, "BASE"), g.const(cls, "T")
        if base in (list, tuple):
            g.add(source, f"type(v) is {t} and {b}.__len__(v) == {len(value)}",
                  f"type({source!r}) is {cls.__name__} and len == {len(value)}")
        else:
            keys = tuple(base.keys(value))
            g.add(source, f"type(v) is {t} and tuple({b}.keys(v)) == {g.const(keys, 'KEYS')}",
                  f"type({source!r}) is {cls.__name__} and keys == {list(keys)}")
            if base is collections.OrderedDict:  # its storage order too (dict's own methods read it)
                g.storage_order_match(source, value)
    if base in (list, tuple):
        items = [og.wrap(base.__getitem__(value, i), BaseItemSource(source, i, via), guard)
                 for i in range(base.__len__(value))]
        var = ListVariable(items, source, cls) if base is list else TupleVariable(items, source, cls)
    else:
        var = DictVariable({k: og.wrap(dict.__getitem__(value, k), BaseItemSource(source, k, via), guard)
                            for k in base.keys(value)}, source, cls)
        if base is collections.OrderedDict:
            odict_order.from_input(var, list(dict.keys(value)))
    return _with_instance_dict(og, var, value, source, guard)


def _with_instance_dict(og, var, value, source, guard):
    """`var` with the instance __dict__ of `value` (its keys guarded) as its attributes."""
    inst = getattr(value, "__dict__", None)
    if isinstance(inst, dict):
        if guard:
            g = og.guards
            g.add(source, f"tuple(v.__dict__) == {g.const(tuple(inst), 'KEYS')}",
                  f"{source!r}.__dict__ keys == {list(inst)}")
        var.attrs = {k: og.wrap(v, AttrSource(source, k), guard) for k, v in inst.items()}
        var.attrs_at_entry = tuple(inst)
    return var


def _wrap_set(og, value, source, guard, base):
    """An instance of a set/frozenset subclass from outside holding constants: guarded on its type and
    its items in their iteration order (read with the base's iterator, past any override); other items
    leave it an opaque object."""
    keys = list(base.__iter__(value))
    if not all(is_constant(k) for k in keys):
        return None
    real = set(keys)
    if list(real) != keys:  # a table grown by deletions: capture's copy would iterate in another order
        return None
    g = og.guards if guard else None
    if g:
        b, t = g.const(base, "BASE"), g.const(type(value), "T")
        g.add(source, f"type(v) is {t} and tuple({b}.__iter__(v)) == {g.const(tuple(keys), 'KEYS')}",
              f"type({source!r}) is {type(value).__name__} and items == {keys!r} in this order")
    var = SetVariable([(k, ConstantVariable(k)) for k in real], source, keys=real)
    var.cls = type(value)
    return _with_instance_dict(og, var, value, source, guard)


def write_back(g, container, target):
    """Glue lines (format, value Variable or None) that give an existing subclass instance its final
    items and __dict__, through the base's methods (its own __setitem__ or __setattr__ may do anything);
    None for a container that is not such an instance."""
    base = _plain_subclass(container.python_type())
    if base is None:
        return None
    b = g.const(base, "BASE")
    todo = []
    if base is list:
        todo.append((f"{b}.__setitem__({target}, slice(None), {{}})", ListVariable(container.items)))
    elif base is set:  # in place, past the subclass's own operators, so the set keeps its own table
        todo.append((f"__s = {target}; __n = {{}}; {b}.difference_update(__s, {b}.difference(__s, __n)); "
                     f"{b}.update(__s, __n)", SetVariable(container.vars.items())))
    elif base is collections.OrderedDict and odict_order.differs(container):  # both its orders
        orders = TupleVariable([DictVariable(odict_order.storage_items(container)), DictVariable(container.items)])
        todo.append((f"__d = {target}; __o = {{0}}; {b}.clear(__d); [{b}.__setitem__(__d, __k, __v) for __k, __v in "
                     f"__o[0].items()]; {g.const(odict_order.relinked, 'RELINK')}(__d, __o[1])", orders))
    elif base not in _IMMUTABLE:
        todo.append((f"__d = {target}; {b}.clear(__d); [{b}.__setitem__(__d, __k, __v) for __k, __v in {{}}.items()]",
                     DictVariable(container.items)))
    for name, value in container.attrs.items():
        todo.append((f"object.__setattr__({target}, {name!r}, {{}})", value))
    for name in getattr(container, "attrs_at_entry", ()):
        if name not in container.attrs:
            todo.append((f"object.__delattr__({target}, {name!r})", None))
    return todo


for _base in _BASES:
    objects.SUBCLASS_CONSTRUCTORS[_base] = construct
    graph_builder.SUBCLASS_WRAPPERS[_base] = wrap_instance
for _base in (list, tuple, dict, set, frozenset):
    BUILTIN_HANDLERS[_base.__new__] = _base_new(_base)
glue.MUTATION_WRITERS.append(write_back)
