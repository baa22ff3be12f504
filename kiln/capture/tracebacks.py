"""The `__traceback__` of exceptions made during capture, built as CPython builds it.

CPython adds one traceback entry (frame, line, instruction) in front of an exception's
`__traceback__` in each frame the exception passes through: where it is raised (by `raise` or by a
failing operation) and in every calling frame it propagates into; a bare `raise` (RERAISE) adds none.
Capture runs the same frames, so it builds the same chain of entries (TracebackVariable): `tb_lineno`
and `tb_next` are known, and `tb_next` can be set as in CPython. What capture does not have is the
frame objects themselves (`tb_frame`) nor the instruction offsets of the original code once it runs
a resume function (`tb_lasti`): reading them stops the capture.

An exception raised by Python code capture ran natively (not followed frame by frame) has entries in
eager code that capture does not know: the chain ends in an UnknownTraceback there, which `is None`
is False of and any other use stops the capture. An exception made but never raised has no traceback
(None, as in eager code); one the program set (`e.__traceback__ = tb`, `with_traceback`) has what it set.

An exception made during capture that outlives it (returned, or alive past a graph break) is copied
per call by the glue (exception_copies); the copy gets a real traceback with these entries (file,
function, line as eager's; a stand-in frame object, as compiled code has none of the user's frames).
"""
import os
import types

from kiln.capture.resume import resumed_from
from kiln.capture.variables import ConstantVariable, HandlerVariable, ObjectVariable, const
from kiln.exc import Unsupported

_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class UnknownTraceback(HandlerVariable):
    """A traceback that exists in eager code but whose entries capture does not know."""

    def python_type(self):
        return types.TracebackType


class TracebackVariable(HandlerVariable):
    """One traceback entry made during capture: the line of the instruction the exception passed
    through, and `tb_next` (the Variable of the next entry, or Const(None))."""

    def __init__(self, code, lineno, tb_next):
        self.code, self.lineno, self.tb_next = code, lineno, tb_next

    def python_type(self):
        return types.TracebackType

    def var_getattr(self, frame, name):
        if name == "tb_lineno":
            return const(self.lineno)
        if name == "tb_next":
            return self.tb_next
        raise Unsupported(f"the {name} of a traceback made during capture (its frames exist only in eager code)",
                          kind="unsupported_python")

    def var_setattr(self, frame, name, value):
        if name != "tb_next":
            e = AttributeError(f"attribute '{name}' of 'traceback' objects is not writable") \
                if name in ("tb_frame", "tb_lasti", "tb_lineno") else \
                AttributeError(f"'traceback' object has no attribute '{name}'")
            raise Unsupported(str(e), python_exception=e)
        if not (_is_none(value) or isinstance(value, TracebackVariable)):
            if isinstance(value, UnknownTraceback):
                raise Unsupported("linking a traceback whose entries capture does not know", kind="unsupported_python")
            if not isinstance(value, ConstantVariable):
                raise Unsupported(f"tb_next set to {type(value).__name__}", kind="unsupported_python")
            e = _native_tb_next_error(value.value)  # (its wording differs between CPython versions)
            raise Unsupported(str(e), python_exception=e)
        link = value  # CPython refuses a link that would make the chain a loop
        while isinstance(link, TracebackVariable):
            if link is self:
                e = ValueError("traceback loop detected")
                raise Unsupported(str(e), python_exception=e)
            link = link.tb_next
        self.tb_next = value


def _native_tb_next_error(value):
    """The TypeError CPython raises for `tb.tb_next = value`, from a real traceback of our own."""
    try:
        raise LookupError
    except LookupError as e:
        tb = e.__traceback__
    try:
        tb.tb_next = value
    except TypeError as e:
        return e.with_traceback(None)
    raise AssertionError(f"tb_next accepted {value!r}")


def _is_none(v):
    return isinstance(v, ConstantVariable) and v.value is None


def traceback_of(og, exc):
    """The Variable for `exc.__traceback__`, exc made during this capture."""
    entry = og.tracebacks.get(id(exc))
    return entry[1] if entry is not None else const(None)


def traceback_var(og, exc_var):
    """The Variable of `exc.__traceback__` for an exception's Variable: modelled for one made during this
    capture, the real one (unguarded, as the exception itself) for one that exists outside it."""
    if exc_var.source is None:
        return traceback_of(og, exc_var.value)
    return og.wrap(exc_var.value.__traceback__, None, guard=False)


def set_traceback(og, exc, value):
    """`exc.__traceback__ = value`: None or a traceback (CPython's TypeError otherwise)."""
    if _is_none(value) or isinstance(value, (UnknownTraceback, TracebackVariable)) or \
            isinstance(value, ObjectVariable) and isinstance(value.value, types.TracebackType):
        og.tracebacks[id(exc)] = (exc, value)
        return
    e = TypeError("__traceback__ must be a traceback or None")
    raise Unsupported(str(e), python_exception=e)


def passes_through(frame, exc, inst):
    """`exc` passes through a frame of the capture at `inst` (raised there, or propagating into it from
    a call): a new entry goes in front of its traceback, as CPython's PyTraceBack_Here does."""
    og = frame.og
    entry = og.tracebacks.get(id(exc))
    if entry is not None:
        below = entry[1]
    else:  # first seen: raised by capture itself, or natively (then its Python frames are unknown)
        below = UnknownTraceback() if _ran_python_code(exc.__traceback__) else const(None)
    lineno = inst.positions.lineno if inst.positions is not None else None
    og.tracebacks[id(exc)] = (exc, TracebackVariable(frame.code, lineno if lineno is not None else -1, below))


def escaping_tracebacks(og, exc):
    """For the glue's copy of an exception made during capture that outlives it (returned, or alive
    past a graph break): {id(exception): (entries, tail)} for it and the exceptions chained to it
    whose traceback capture built. entries: (file, function name, line), outermost first, made
    into real traceback entries by exception_copies; tail: a real traceback the chain ends in, or None
    (also where capture does not know the rest of it: then only the entries it knows are there)."""
    out, seen, todo = {}, set(), [exc]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        entry = og.tracebacks.get(id(exc))
        if entry is not None and not _is_none(entry[1]):
            out[id(exc)] = _entries(entry[1])
        todo += [exc.__cause__, exc.__context__]
    return out


def _entries(tb):
    entries, seen = [], set()
    while isinstance(tb, TracebackVariable) and id(tb) not in seen:
        seen.add(id(tb))
        code = resumed_from(tb.code)
        entries.append((code.co_filename, code.co_name, tb.lineno))
        tb = tb.tb_next
    tail = tb.value if isinstance(tb, ObjectVariable) and isinstance(tb.value, types.TracebackType) else None
    return tuple(entries), tail


def _ran_python_code(tb):
    """Whether a real traceback holds a frame of code outside kiln (code eager runs as frames)."""
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_KILN_DIR):
            return True
        tb = tb.tb_next
    return False
