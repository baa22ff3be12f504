"""Exceptions made during capture, handed to each call of the compiled code as new objects.

Capture makes an exception object for real (`ValueError(1, 2)`, a KeyError a dict lookup raised,
PEP 479's RuntimeError) and changes it natively (`e.foo = 1`, `e.__cause__ = ...`). Eager code makes
a new one on every call, so the glue must not hand out that one object again and again (two calls
would get the same object, and one caller's change would show in the other's). It hands out a copy
made per call: same class, `args`, instance attributes, the attributes CPython keeps in C slots
(AttributeError.name, StopIteration.value, ...), and the chained __cause__/__context__ copied alike.
User __init__ does not run again (eager ran it once per call; capture already ran it once).
"""
import functools
import types

_LINKS = ("__cause__", "__context__")
# state every exception has, set here on its own terms (the traceback from what capture built, see
# tracebacks.escaping_tracebacks: the real one on `proto` is kiln's own)
_NOT_SLOTS = {"args", "__traceback__", "__cause__", "__context__", "__suppress_context__", "__dict__"}


def fresh_exception(proto, tracebacks=None, memo=None):
    """A new exception equal to `proto` in everything eager code can see but identity. `tracebacks`
    ({id(proto or a chained exception): (entries, tail)}) gives those raised during capture their
    traceback: an entry per frame they passed through, each with the file, function and line eager's
    has; its frame object stands in for the frame (which compiled code never makes: no locals)."""
    memo = {} if memo is None else memo
    if id(proto) in memo:
        return memo[id(proto)]
    cls = type(proto)
    exc = cls.__new__(cls, *proto.args)
    memo[id(proto)] = exc
    exc.args = proto.args
    for name in _slot_names(cls):
        try:
            setattr(exc, name, getattr(proto, name))
        except (AttributeError, TypeError):  # read-only in this CPython: __new__ set it from args
            pass
    if getattr(proto, "__dict__", None):
        exc.__dict__.update(proto.__dict__)
    for link in _LINKS:
        linked = getattr(proto, link)
        setattr(exc, link, fresh_exception(linked, tracebacks, memo) if linked is not None else None)
    exc.__suppress_context__ = proto.__suppress_context__
    if tracebacks and id(proto) in tracebacks:
        exc.__traceback__ = _real_traceback(*tracebacks[id(proto)])
    return exc


def _real_traceback(entries, tail):
    tb = tail
    for filename, name, lineno in reversed(entries):
        # (tb_lasti -1: no instruction of the stand-in frame's code; traceback then prints no carets)
        tb = types.TracebackType(tb, _frame_standing_for(filename, name), -1, lineno)
    return tb


@functools.lru_cache(maxsize=256)
def _frame_standing_for(filename, name):
    """A finished frame whose code names `filename` and `name` (traceback printing shows the user's file,
    function and, from tb_lineno, line)."""
    code = compile("def f():\n    return __import__('sys')._getframe()", filename, "exec").co_consts[0]
    return types.FunctionType(code.replace(co_name=name, co_qualname=name), {"__builtins__": __builtins__})()


def _slot_names(cls):
    """Attributes a builtin exception class keeps in C members (AttributeError's name and obj,
    StopIteration's value, OSError's errno, ...): copy.copy would drop them."""
    names = []
    for klass in cls.__mro__:
        if klass.__module__ != "builtins":
            continue
        for name, raw in vars(klass).items():
            if name not in _NOT_SLOTS and isinstance(raw, (types.MemberDescriptorType, types.GetSetDescriptorType)):
                names.append(name)
    return names
