"""collections.deque made or passed in the frame, the C helpers of collections (Counter's
_count_elements) and types.MappingProxyType made in the frame: models over Variables, registered in
objects / python_builtins / glue."""
import collections
import types

from kiln.capture import glue, objects
from kiln.capture.objects import TypeModel, call, const_value, getitem, iter_next, setitem, unpack_iterable
from kiln.capture.python_builtins import BUILTIN_HANDLERS, call_list_method
from kiln.capture.variables import BaseIterator, DequeVariable, DictVariable, const
from kiln.exc import Unsupported


def make_deque(frame, args, kwargs):
    items = unpack_iterable(frame, args[0]) if args else []
    maxlen = args[1] if len(args) > 1 else kwargs.get("maxlen", const(None))
    maxlen = const_value(maxlen, "deque maxlen")
    if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
        raise Unsupported("deque maxlen must be a non-negative int", python_exception=ValueError("maxlen"))
    d = DequeVariable([], maxlen=maxlen)
    _extend(d, items, left=False)
    return d


def _extend(d, items, left):
    """Add items at one end; a bounded deque drops as many from the other end, as CPython does."""
    for item in items:
        if left:
            d.items.insert(0, item)
        else:
            d.items.append(item)
        if d.maxlen is not None and len(d.items) > d.maxlen:
            d.items.pop(-1 if left else 0)


class DequeModel(TypeModel):
    _MUTATORS = {"append", "appendleft", "extend", "extendleft", "pop", "popleft", "rotate", "insert"}

    def attribute(self, frame, d, name):
        if name == "maxlen":
            return const(d.maxlen)
        return self.method_attribute(frame, d, collections.deque, name)

    def call_method(self, frame, d, name, args, kwargs):
        if name not in self._MUTATORS:
            if name == "copy":
                return DequeVariable(d.items, maxlen=d.maxlen)
            if name == "__getitem__":
                return getitem(frame, d, args[0])
            if name == "__setitem__":
                setitem(frame, d, args[0], args[1])
                return const(None)
            return call_list_method(frame, d, name, args, kwargs)
        frame.og.side_effects.mark_mutated(d)
        if name in ("append", "appendleft"):
            _extend(d, [args[0]], left=name == "appendleft")
        elif name in ("extend", "extendleft"):
            if isinstance(args[0], BaseIterator):  # added as it yields: its code (a generator's, map's
                while (item := iter_next(frame, args[0])) is not None:  # function) sees the deque grow
                    _extend(d, [item], left=name == "extendleft")
            else:
                _extend(d, unpack_iterable(frame, args[0]), left=name == "extendleft")
        elif name in ("pop", "popleft"):
            if not d.items:
                raise Unsupported(f"{name} from an empty deque", python_exception=IndexError(f"{name} from an empty deque"))
            return d.items.pop(-1 if name == "pop" else 0)
        elif name == "rotate":
            n = const_value(args[0], "rotate count") if args else 1
            if d.items:
                n %= len(d.items)
                d.items[:] = d.items[-n:] + d.items[:-n] if n else d.items
        else:  # insert
            if d.maxlen is not None and len(d.items) >= d.maxlen:
                raise Unsupported("deque already at its maximum size", python_exception=IndexError("deque full"))
            return call_list_method(frame, d, name, args, kwargs)
        return const(None)


def _count_elements(frame, args, kwargs):
    """collections._count_elements(mapping, iterable): mapping[e] = mapping.get(e, 0) + 1 for each e."""
    mapping, items = args[0], unpack_iterable(frame, args[1])
    get = objects.getattr_var(frame, mapping, "get")
    for item in items:
        count = call(frame, get, [item, const(0)], {})
        setitem(frame, mapping, item, objects.apply_operator(frame, objects.operator.add, [count, const(1)]))
    return const(None)


class MappingProxyVariable(DictVariable):
    """types.MappingProxyType(d) made in the frame over a dict Variable: a read-only view whose items
    are d's own, so a later write to d shows through it, during the call and (rebuilt as
    MappingProxyType(d)) after it."""

    def __init__(self, proxied):  # (not DictVariable's: it keeps no items of its own)
        self.proxied, self.source, self.cls, self.attrs = proxied, None, types.MappingProxyType, {}

    @property
    def items(self):
        return self.proxied.items


def make_mapping_proxy(frame, args, kwargs):
    if len(args) == 1 and not kwargs and isinstance(args[0], DictVariable):
        target = args[0]
        return MappingProxyVariable(target.proxied if isinstance(target, MappingProxyVariable) else target)
    return objects.fold_natively(frame.og, types.MappingProxyType, args, kwargs)  # a constant mapping


BUILTIN_HANDLERS[collections.deque] = make_deque
BUILTIN_HANDLERS[types.MappingProxyType] = make_mapping_proxy
glue.REBUILDERS[MappingProxyVariable] = lambda g, var: f"{g.const(types.MappingProxyType, 'PROXY')}({g.value(var.proxied)})"
BUILTIN_HANDLERS[collections._count_elements] = _count_elements
objects.VARIABLE_MODELS[DequeVariable] = DequeModel()
