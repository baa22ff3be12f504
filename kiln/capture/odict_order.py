"""The storage order of an OrderedDict Variable, kept beside its own order.

A CPython OrderedDict is a dict (its storage, in insertion order) plus a linked list giving its own
order. Both change together on inserts and removals; move_to_end changes the list only. Iteration,
views, copy, dict(od), `{**od}`, `x.update(od)` and repr read the list; dict's own methods called on it
(`dict.keys(od)`, `dict.items(od)`, `dict.__iter__(od)`, `dict.popitem(od)`, ...) read the storage
(checked on CPython 3.11-3.13). A DictVariable keeps its own order in `items`; `storage` (None: the
same order) holds the storage's keys once the two differ. The glue rebuilds such a dict and writes
one back into an existing object with both orders (storage first, then move_to_end in its own order)."""
import collections

STORAGE_READS = {"keys", "values", "items", "__iter__", "__reversed__", "__repr__", "popitem"}


def is_ordered(d):
    return issubclass(d.cls, collections.OrderedDict)


def storage_order(d):
    """The keys of `d`'s storage, in order."""
    storage = getattr(d, "storage", None)
    if storage is None:
        return list(d.items)
    known = set(storage)  # (a key stored without dict_mutation, `d[k] = v`, went to both ends)
    return [k for k in storage if k in d.items] + [k for k in d.items if k not in known]


def differs(d):
    return getattr(d, "storage", None) is not None


def before_reorder(d):
    """move_to_end is about to change `d`'s own order only: its storage keeps the current order (keys
    a plain store added since its last change are placed now, while they are last in both orders)."""
    if is_ordered(d):
        d.storage = storage_order(d)


def after_change(d, before):
    """`d` inserted or removed keys (its keys were `before`): the storage drops the removed ones and
    appends the new ones, in the order its own order got them (both at the end)."""
    if not differs(d):
        return
    known = set(d.storage)  # (added by a plain store before `before` was read: new at both ends)
    kept = [k for k in d.storage if k in d.items and k in before]
    new = [k for k in d.items if k not in before or k not in known]
    d.storage = kept + new
    if d.storage == list(d.items):
        d.storage = None


def from_input(d, storage):
    """`d` wraps an existing OrderedDict whose storage holds `storage` (keys as `d.items` has them)."""
    if storage != list(d.items):
        d.storage = storage


def storage_items(d):
    """`d`'s items in storage order (a plain dict of key -> Variable)."""
    return {k: d.items[k] for k in storage_order(d)}


def relinked(od, links):
    """At run time: `od` built in storage order, given its own order by moving each key to the end
    (OrderedDict's own method: a subclass's override must not run during a restore)."""
    for k in links:
        collections.OrderedDict.move_to_end(od, k)
    return od


def restore(od, orders):
    """At run time: write the existing OrderedDict `od` back as (storage-ordered dict, own-ordered dict)."""
    storage, links = orders
    od.clear()
    od.update(storage)
    return relinked(od, links)
