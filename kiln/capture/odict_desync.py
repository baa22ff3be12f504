"""An OrderedDict whose order bookkeeping dict's own methods bypassed, modelled as far as CPython is
deterministic about it.

A C OrderedDict is a dict (its storage) plus a linked list of nodes giving its order, found from a key
through an array indexed by the key's entry in the storage. `dict.pop(od, k)`, `dict.update(od, d)`,
`dict.clear(od)` ... change the storage only: the list keeps a node for a removed key, gets none for an
added one, and from then on CPython iterates the OrderedDict inconsistently (list(od) raises KeyError
or misses keys, a later resize maps stale nodes onto other keys, and 3.13 can crash). What stays exact:

- what reads the storage only: len, `in`, `[k]`, get, `==` with a dict (dict's comparison), truth;
- writes to the storage: dict's own methods; OrderedDict's setitem/setdefault/update (a storage insert,
  plus a node that may or may not be made: such keys leave `linked`);
- OrderedDict.pop(k) of a key still holding its own node (`linked`: the keys present before the
  bypass, none of them removed since); of an absent key only while nothing was added, cleared or
  popitem'd since the bypass (the lookup then lands on an empty slot: KeyError or the default).

Everything else (iteration, views, repr, copy, popitem, move_to_end, `==` with another OrderedDict
whose storage is equal) raises Unsupported, and the glue refuses to rebuild such a dict (the frame
then runs eagerly; under fullgraph that is an error), so no consistent copy ever stands in for it.
Only an exact OrderedDict made in the frame is desynchronized; an existing one keeps breaking at the
bypassing call, which then runs natively on the real object. Fuzzed against CPython 3.11-3.13."""
import collections
import operator

from kiln.capture import glue, objects, odict_order
from kiln.capture.objects import TypeModel, apply_operator, dict_key
from kiln.capture.python_builtins import check_dict_arguments, dict_method, dict_mutation
from kiln.capture.variables import ConstantVariable, DictVariable, Variable, const
from kiln.exc import Unsupported

_REMOVERS = {"pop", "popitem", "__delitem__", "clear"}
_ADDERS = {"__setitem__", "setdefault", "update", "__ior__"}
_STORAGE_READS = {"__len__", "__contains__", "__getitem__", "get"}


class DesyncedOrderedDict(Variable):
    """An OrderedDict made in the frame after dict's own method added or removed a key. `items`: its
    storage (key -> Variable); `linked`: keys known to own their node; `absent_safe`: whether looking
    up an absent key still finds no node. Not a DictVariable, so no dict path handles it unawares."""

    def python_type(self):
        return self.cls


def bypasses_order(cls, d, name):
    """`cls.name(d, ...)` is dict's own key-adding or key-removing method called on an OrderedDict."""
    return isinstance(d, DictVariable) and issubclass(d.cls, collections.OrderedDict) and cls is dict and \
        name in _REMOVERS | _ADDERS


def bypass(frame, d, name, args, kwargs):
    """dict's own `name` on the OrderedDict `d`: applied to its storage; if that changes its keys, `d`
    becomes a DesyncedOrderedDict. One that existed before the frame (or a subclass, whose own methods
    might read the order) breaks the graph here instead."""
    if _keeps_keys(d, name, args, kwargs):  # values only: the order bookkeeping has nothing to miss
        return objects.call_method(frame, d, name, args, kwargs)
    if not _may_desync(d, name):
        raise Unsupported(f"dict.{name} on an OrderedDict bypasses its order bookkeeping", kind="unsupported_object")
    order = list(d.items)
    before = set(order)
    result = objects.call_method(frame, d, name, args, kwargs)  # dict's semantics on the storage; raises first
    if set(d.items) != before:
        d.__class__ = DesyncedOrderedDict  # the same object: every reference to it now sees the desync
        d.links = order  # the nodes, in order: dict's methods never touch them
        d.linked = before & set(d.items)
        d.absent_safe = name in ("pop", "__delitem__")  # (nothing added, nothing resized)
    return result


def _keeps_keys(d, name, args, kwargs):
    """Whether `dict.name(d, *args, **kwargs)` surely adds and removes no key (read without consuming
    an iterator argument)."""
    if name in ("__setitem__", "setdefault"):
        return bool(args) and dict_key(args[0]) in d.items
    if name in ("update", "__ior__"):
        return all(isinstance(a, DictVariable) and all(k in d.items for k in a.items) for a in args) and \
            all(k in d.items for k in kwargs)
    return False


def _may_desync(d, name):
    if type(d) is not DictVariable or d.cls is not collections.OrderedDict or d.source is not None or d.attrs:
        return False
    if odict_order.differs(d):  # (its storage order is not its order: the model keeps one order)
        return False
    return name != "popitem" or len(d.items) <= 1  # (which entry dict.popitem takes needs the storage order)


def call_unbound(frame, cls, d, name, args, kwargs):
    """`cls.name(d, ...)` on a DesyncedOrderedDict: dict's own methods act on the storage,
    OrderedDict's as the model says."""
    if cls is dict and name in _REMOVERS | _ADDERS:
        if name == "popitem" and (args or kwargs or len(d.items) > 1):
            raise _refused("dict.popitem with more than one key (which one needs the storage order)")
        check_dict_arguments(d, name, args, kwargs)
        before = set(d.items)
        result = dict_mutation(frame, d, name, args, kwargs)  # the nodes stay as they were
        d.linked &= set(d.items)
        if set(d.items) - before or name in ("popitem", "clear"):
            d.absent_safe = False
        return result
    if cls in (dict, collections.OrderedDict):
        return _MODEL.call_method(frame, d, name, args, kwargs)
    raise _refused(f"{cls.__name__}.{name}")


def clean(d):
    """No stale node: the node list is known and each of its keys is present and owns its node (keys
    only in the storage may exist). Then iteration walks exactly `links`."""
    return d.links is not None and all(k in d.linked for k in d.links)


def _written_keys(frame, d, name, args, kwargs):
    """The keys OrderedDict's own insert `name` writes, in order (an iterator argument is not read:
    None, unknown)."""
    if name == "__setitem__":
        return [dict_key(args[0])]
    if name == "setdefault":  # (a present key is only read)
        return [] if dict_key(args[0]) in d.items else [dict_key(args[0])]
    if all(isinstance(a, DictVariable) for a in args):
        return [k for a in args for k in a.items] + list(kwargs)
    return None


def _nodes_for(d, written, was_clean):
    """After OrderedDict's own insert of `written`: a key owning its node keeps it; with no stale node
    about, any other key gets a new node at the end (its slot is empty); else which keys got nodes is
    unknown."""
    if written is None or not was_clean:
        d.links = None
        d.absent_safe = False
        return
    for k in written:
        if k not in d.linked:
            d.links.append(k)
            d.linked.add(k)


def _refused(what):
    return Unsupported(f"{what} on an OrderedDict whose order dict's own methods left inconsistent (CPython's "
                       f"result depends on its hash table)", kind="unsupported_object")


class DesyncedModel(TypeModel):
    protocols = True

    def attribute(self, frame, d, name):
        return self.method_attribute(frame, d, d.cls, name)

    def call_method(self, frame, d, name, args, kwargs):
        if name in _STORAGE_READS:
            return dict_method(frame, d, name, args, kwargs)  # (it reads d.items only, for these)
        if name in ("__setitem__", "setdefault", "update", "__ior__"):
            check_dict_arguments(d, name, args, kwargs)
            written = _written_keys(frame, d, name, args, kwargs)
            was_clean = clean(d)
            result = dict_mutation(frame, d, name, args, kwargs)  # the storage as dict's
            _nodes_for(d, written, was_clean)
            return result
        if name == "pop":
            check_dict_arguments(d, name, args, kwargs)
            k = dict_key(args[0])
            if k in d.linked:
                d.linked.discard(k)
                if d.links is not None:
                    d.links.remove(k)
                return dict_mutation(frame, d, name, args, kwargs)
            if k not in d.items and (d.absent_safe or clean(d)):  # the lookup lands on an empty slot
                return dict_mutation(frame, d, name, args, kwargs)
        if name in ("__eq__", "__ne__"):
            return self.operator(frame, operator.eq if name == "__eq__" else operator.ne, [d, args[0]])
        raise _refused(f"OrderedDict.{name}")

    def text(self, frame, d, conv):
        """repr / str / format(d, ""): an empty storage prints as `OrderedDict()`; else CPython walks
        the nodes, reading each key's value from the storage (3.12+: through dict(d), the same walk)."""
        if not d.items:
            return conv(collections.OrderedDict())
        if not clean(d) or not d.links:
            raise _refused(f"{conv.__name__}()")
        return conv(objects.const_value(_walked(d), f"{conv.__name__}() of an OrderedDict"))

    def mapping_items(self, frame, d):
        """What dict(d) / x.update(d) read: d.keys() as iterated, each value from the storage."""
        if not clean(d):
            raise _refused("reading it as a mapping")
        return dict(_walked(d).items)

    def operator(self, frame, op, args):
        """`==` / `!=`: OrderedDict's comparison is dict's on the storage, then (both OrderedDicts,
        storages equal) the order, which a desynchronized one cannot tell."""
        if op not in (operator.eq, operator.ne) or len(args) != 2:
            raise _refused(f"operator {op.__name__}")
        plain = [_storage(a) for a in args]
        if any(p is None for p in plain):
            raise _refused(f"== with {objects.describe(args[1 if plain[0] is not None else 0])}")
        same = apply_operator(frame, operator.eq, plain)
        both_ordered = all(issubclass(a.python_type(), collections.OrderedDict) for a in args)
        if both_ordered and not (isinstance(same, ConstantVariable) and same.value is False):
            raise _refused("== between OrderedDicts with equal storage (their order decides)")
        return same if op is operator.eq else const(not same.value) if isinstance(same, ConstantVariable) else \
            apply_operator(frame, operator.not_, [same])


def _walked(d):
    """A consistent OrderedDict Variable over the walk of a clean `d`'s nodes."""
    return DictVariable({k: d.items[k] for k in d.links}, cls=collections.OrderedDict)


def _storage(v):
    """A plain dict Variable over what dict's comparison reads of `v`; None: not a kind compared here."""
    if isinstance(v, DesyncedOrderedDict):
        return DictVariable(v.items)
    if type(v) is DictVariable and v.cls in (dict, collections.OrderedDict):
        return DictVariable(v.items)
    return None


def _no_rebuild(g, var):
    raise _refused("rebuilding it after the call")


_MODEL = DesyncedModel()
objects.VARIABLE_MODELS[DesyncedOrderedDict] = _MODEL
glue.REBUILDERS[DesyncedOrderedDict] = _no_rebuild
