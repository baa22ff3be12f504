"""Has a class changed since capture? One cheap check per class, from CPython's type version tags.

Capture reads facts through classes all the time: which function `obj.method` is, whether a class
defines `__call__`, `__getattr__` or a data descriptor that shadows an instance attribute, the MRO.
Guarding each fact separately would cost a check per (class, name); instead a class is guarded whole.

CPython keeps a version tag per class (`tp_version_tag`, for its method cache) and resets it to 0
whenever the class or any class in its MRO is modified (an attribute set or deleted, `__bases__`
reassigned); a new tag comes from a counter that only grows, so it never equals an old one. A class
whose tag still equals the one remembered has every attribute, along its whole MRO, it had then.
The tag is read with ctypes at its offset in PyTypeObject; `_TAG_OFFSET` is used only after
checking the layout on fields Python also exposes and watching a tag change on a class modified
here (`_tags_work`).

A moved tag does not always mean a change: make_fx patches nn.Module's __call__ and __getattr__
while it traces and puts them back, which moves the tag of every module class. So a moved tag takes
the slow path: the class dicts along the MRO are compared entry by entry (by identity) with a
snapshot taken at capture; if they are the same, the new tag is remembered and the fast path holds
again. Where tags cannot be used (another interpreter build), every check takes the slow path.

Built-in (static) and immutable classes cannot change, so they need no guard at all.

A watch holds its class, the MRO and the attributes it remembers weakly where it can (a class made
at run time must die with its last instance, and a method using `super()` refers to its class): a
class that died is "changed", and the entry guarding it is dropped by its Liveness anyway.
"""
import ctypes
import types
import weakref

_HEAPTYPE, _IMMUTABLE, _VALID_TAG = 1 << 9, 1 << 8, 1 << 19
# byte offsets in PyTypeObject on 64-bit CPython 3.11-3.13 (cpython/object.h)
_BASICSIZE_OFFSET, _FLAGS_OFFSET, _MRO_OFFSET, _TAG_OFFSET = 32, 168, 344, 384


def can_change(cls):
    """Whether `cls`'s attributes can be reassigned (a class defined in Python, not a built-in)."""
    flags = cls.__flags__
    return bool(flags & _HEAPTYPE) and not flags & _IMMUTABLE


def _tag_ref(cls):
    return ctypes.c_uint.from_address(id(cls) + _TAG_OFFSET)


def tag_reference(cls):
    """The place in memory `cls`'s version tag is read from (guard_expression's TAG constant)."""
    return _tag_ref(cls)


def _assign_tag(cls):
    # a failed class-attribute lookup goes through the method cache, which gives the class (and
    # its bases) a valid tag if it has none
    getattr(cls, "__kiln_class_watch_probe__", None)


def current_tag(cls):
    """The class's valid version tag now, or None where tags cannot be used for it."""
    if not _TAGS_WORK:
        return None
    _assign_tag(cls)
    if not cls.__flags__ & _VALID_TAG:
        return None
    tag = _tag_ref(cls).value
    return tag or None


class ClassWatch:
    """Watches one class from capture on: `tag` is the version tag under which its dicts were last
    found as in the snapshot (see the module docstring)."""

    __slots__ = ("cls", "snapshot", "tag_ref", "tag")

    def __init__(self, cls):
        self.cls, self.snapshot = weakref.ref(cls), _snapshot(cls)
        self.tag_ref = _tag_ref(cls) if _TAGS_WORK else None
        self.tag = current_tag(cls)

    def unchanged_since_tag_moved(self):
        """The slow path: whether the class dicts are as in the snapshot (a patch undone); if so the
        tag now is remembered, so the next check takes the fast path again."""
        if not _dicts_unchanged(self.snapshot):
            return False
        self.tag = current_tag(self.cls())
        return True


def guard_expression(cls, const):
    """A Python expression true while `cls` is unchanged since now; `const(obj, hint)` interns the
    objects it refers to (the watch holds the class weakly)."""
    watch = ClassWatch(cls)
    name = const(watch, "CLSW")
    if watch.tag_ref is None:
        return f"{name}.unchanged_since_tag_moved()"
    return f"({const(watch.tag_ref, 'TAG')}.value == {name}.tag or {name}.unchanged_since_tag_moved())"


def _snapshot(cls):
    """(class, its MRO, and for each changeable class in it, a _DictSnapshot), all held weakly where
    the values allow it."""
    return (weakref.ref(cls), tuple(map(weakref.ref, _mro(cls))),
            tuple(_dict_snapshot(k) for k in _mro(cls) if can_change(k)))


class _DictSnapshot:
    """A check per attribute of one class that the class still holds that same object. Shared by the
    watches taken while the class keeps one version tag (its dict cannot have changed in between):
    a base under many classes (nn.Module, 80-odd attributes) is remembered once, not per watch."""

    __slots__ = ("klass", "attrs", "tag", "__weakref__")

    def __init__(self, klass, tag):
        self.klass, self.tag = weakref.ref(klass), tag
        self.attrs = {name: _same_as(v, klass) for name, v in _class_dict(klass).items()}


def _dict_snapshot(klass):
    tag = current_tag(klass)  # (read first: a change while the snapshot is taken moves it)
    ref = _DICT_SNAPSHOTS.get(klass)
    found = ref() if ref is not None else None
    if found is None or tag is None or found.tag != tag:
        found = _DictSnapshot(klass, tag)
        if tag is not None:
            _DICT_SNAPSHOTS[klass] = weakref.ref(found)
    return found


# class -> its latest _DictSnapshot, held weakly both ways: the watches holding a snapshot keep it,
# and a snapshot holding one of its class's values plainly must not keep the class alive from here
_DICT_SNAPSHOTS = weakref.WeakKeyDictionary()


# a class's own MRO and dict, as type's slots hold them (a metaclass may shadow the attributes)
_mro = type.__dict__["__mro__"].__get__
_class_dict = type.__dict__["__dict__"].__get__


def _same_as(value, klass):
    """check(now, klass) -> whether `now`, found in `klass`'s dict, is `value`, without keeping
    `klass` alive: a weak reference where the type allows one; the class's own slots (`__dict__`,
    `__weakref__`, which refer to it) by kind and owner; other values (numbers, strings, static
    methods) held plainly."""
    if isinstance(value, _OWN_SLOTS) and value.__objclass__ is klass:
        kind = type(value)
        return lambda now, klass: type(now) is kind and now.__objclass__ is klass
    try:
        ref = weakref.ref(value)
    except TypeError:
        return lambda now, klass: now is value
    return lambda now, klass: now is ref()


_OWN_SLOTS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def _dicts_unchanged(snapshot):
    cls, mro, dicts = snapshot
    cls = cls()
    if cls is None or len(_mro(cls)) != len(mro) or any(a is not b() for a, b in zip(_mro(cls), mro)):
        return False
    for snapshot in dicts:
        klass, attrs = snapshot.klass(), snapshot.attrs
        if klass is None:
            return False
        now = _class_dict(klass)
        if len(now) != len(attrs) or any(not same(now.get(name, _dicts_unchanged), klass)
                                          for name, same in attrs.items()):
            return False
    return True


def _tags_work():
    """Check the PyTypeObject layout on fields Python exposes, then watch a tag change."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return False

    class Probe:
        pass
    at = id(Probe)
    layout_ok = (ctypes.c_ssize_t.from_address(at + _BASICSIZE_OFFSET).value == Probe.__basicsize__ and
                 ctypes.c_ulong.from_address(at + _FLAGS_OFFSET).value == Probe.__flags__ and
                 ctypes.c_void_p.from_address(at + _MRO_OFFSET).value == id(Probe.__mro__))
    if not layout_ok:
        return False
    _assign_tag(Probe)
    before = _tag_ref(Probe).value
    Probe.changed = True
    invalidated = _tag_ref(Probe).value == 0
    _assign_tag(Probe)
    after = _tag_ref(Probe).value
    return bool(Probe.__flags__ & _VALID_TAG) and before != 0 and invalidated and after not in (0, before)


_TAGS_WORK = _tags_work()
