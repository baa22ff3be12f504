"""The `__traceback__` of exceptions made during capture.

Capture raises without frames, so an exception the program raised and caught has no traceback
object here, where eager code has one (not None; its frames and lines). Reading it gives an
UnknownTraceback: `is None` is False as in eager code, and any other use stops the capture (its
frames are not known). An exception made but never raised has none (None, as in eager code); one
the program set (`e.__traceback__ = tb`) has what it set.
"""
import types

from kiln.capture.variables import ConstantVariable, HandlerVariable, ObjectVariable
from kiln.exc import Unsupported


class UnknownTraceback(HandlerVariable):
    """A traceback that exists in eager code but whose frames capture does not know."""

    def python_type(self):
        return types.TracebackType


def traceback_of(og, exc):
    """The Variable for `exc.__traceback__`, exc made during this capture."""
    if id(exc) in og.set_tracebacks:
        return og.set_tracebacks[id(exc)]
    if id(exc) in og.caught_exceptions:
        return UnknownTraceback()
    return ConstantVariable(None)


def set_traceback(og, exc, value):
    """`exc.__traceback__ = value`: None or a traceback (CPython's TypeError otherwise)."""
    if isinstance(value, ConstantVariable) and value.value is None or isinstance(value, UnknownTraceback) or \
            isinstance(value, ObjectVariable) and isinstance(value.value, types.TracebackType):
        og.set_tracebacks[id(exc)] = value
        return
    e = TypeError("__traceback__ must be a traceback or None")
    raise Unsupported(str(e), python_exception=e)
