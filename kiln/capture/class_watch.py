"""Has a class changed since capture? One cheap check per class, from CPython's type version tags.

Capture reads facts through classes all the time: which function `obj.method` is, whether a class
defines `__call__`, `__getattr__` or a data descriptor that shadows an instance attribute, the MRO.
Guarding each fact separately would cost a check per (class, name); instead a class is guarded whole.

CPython keeps a version tag per class (`tp_version_tag`, for its method cache) and resets it to 0
whenever the class or any class in its MRO is modified (an attribute set or deleted, `__bases__`
reassigned); a new tag comes from a counter that only grows, so it never equals an old one. A class
whose tag still equals the one read at capture therefore has every attribute, along its whole MRO,
it had then. The tag is read with ctypes at its offset in PyTypeObject; `_TAG_OFFSET` is used only
after checking the layout on fields Python also exposes and watching a tag change on a class
modified here (`_tags_work`). Where that check fails (another interpreter build), the guard compares
the class dicts along the MRO entry by entry instead: slower, same answer.

Built-in (static) and immutable classes cannot change, so they need no guard at all.
"""
import ctypes

_HEAPTYPE, _IMMUTABLE, _VALID_TAG = 1 << 9, 1 << 8, 1 << 19
# byte offsets in PyTypeObject on 64-bit CPython 3.11-3.13 (cpython/object.h)
_BASICSIZE_OFFSET, _FLAGS_OFFSET, _MRO_OFFSET, _TAG_OFFSET = 32, 168, 344, 384


def can_change(cls):
    """Whether `cls`'s attributes can be reassigned (a class defined in Python, not a built-in)."""
    flags = cls.__flags__
    return bool(flags & _HEAPTYPE) and not flags & _IMMUTABLE


def _tag_ref(cls):
    return ctypes.c_uint.from_address(id(cls) + _TAG_OFFSET)


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


def guard_expression(cls, const):
    """A Python expression true while `cls` is unchanged since now; `const(obj, hint)` interns the
    objects it refers to (they stay alive as long as the guard)."""
    const(cls, "CLS")  # the tag is read at the class's address: keep the class alive with the guard
    tag = current_tag(cls)
    if tag is not None:
        return f"{const(_tag_ref(cls), 'TAG')}.value == {tag}"
    return f"{const(_dicts_unchanged, 'SAMECLS')}({const(_snapshot(cls), 'SNAP')})"


def _snapshot(cls):
    """(class, its MRO, and for each changeable class in it, its attributes by identity)."""
    return cls, cls.__mro__, tuple((k, dict(k.__dict__)) for k in cls.__mro__ if can_change(k))


def _dicts_unchanged(snapshot):
    cls, mro, dicts = snapshot
    if cls.__mro__ != mro:
        return False
    for klass, attrs in dicts:
        now = klass.__dict__
        if len(now) != len(attrs) or any(now.get(name, _dicts_unchanged) is not value
                                          for name, value in attrs.items()):
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
