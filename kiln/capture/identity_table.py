"""A table keyed by object identity that forgets an item when its key object dies.

kiln keeps things per code object (compiled entries, decoded instructions, resume functions) and per
function. Keyed by a plain dict, such a table keeps every code object it ever saw alive (a process
that compiles a function per request grows forever), and code objects compare by value, so two
distinct ones that compare equal (exec'd twice, kiln's synthetic callers) would share an item.
`IdentityTable` holds its keys weakly and tells them apart by identity. A value must not refer back
to its key, or the key never dies.
"""
import weakref


class IdentityTable:
    """`obj -> value`, by `obj`'s identity; an item goes when `obj` is garbage collected."""

    def __init__(self):
        self._items = {}  # id(obj) -> (weak reference to obj, value)

    def get(self, obj, default=None):
        item = self._items.get(id(obj))
        if item is not None and item[0]() is obj:  # an id is reused once its object is gone
            return item[1]
        return default

    def __setitem__(self, obj, value):
        key, items = id(obj), self._items

        def forget(ref):  # refers to the dict, not the table: the table may die first
            item = items.get(key)
            if item is not None and item[0] is ref:
                items.pop(key, None)
        items[key] = (weakref.ref(obj, forget), value)

    def setdefault(self, obj, make):
        """The value for `obj`, or `make()` stored as its value."""
        found = self.get(obj, _MISSING)
        if found is _MISSING:
            found = self[obj] = make()
        return found

    def values(self):
        return [item[1] for item in list(self._items.values()) if item[0]() is not None]

    def clear(self):
        self._items.clear()

    def __len__(self):
        return sum(1 for item in list(self._items.values()) if item[0]() is not None)


_MISSING = object()
