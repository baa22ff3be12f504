"""`sys.exc_info()` and `sys.exception()` during capture: the exception being handled.

CPython answers with the exception the innermost frame that is handling one handles, searching
outwards through its callers. Capture knows that for the frames it runs (each frame's exc_info,
set by PUSH_EXC_INFO, cleared by POP_EXCEPT). Past the compiled function's own frame, its caller may
be handling an exception too: capture answers "none" there and guards that the caller handles none
when the compiled code runs (else it recompiles).
"""
import sys

from kiln.capture.python_builtins import BUILTIN_HANDLERS
from kiln.capture.tracebacks import traceback_var
from kiln.capture.variables import ConstantVariable, TupleVariable, const
from kiln.exc import Unsupported


def _no_arguments(name, args, kwargs):
    if args or kwargs:
        e = TypeError(f"{name}() takes no arguments")
        raise Unsupported(str(e), python_exception=e)


def _exc_info(frame, args, kwargs):
    _no_arguments("exc_info", args, kwargs)
    handled = frame.handled_exception()
    if handled is None:
        return const((None, None, None))
    exc = handled.value
    return TupleVariable([frame.og.wrap(type(exc), None, guard=False), handled, traceback_var(frame.og, handled)])


def _exception(frame, args, kwargs):
    _no_arguments("exception", args, kwargs)
    handled = frame.handled_exception()
    return handled if handled is not None else ConstantVariable(None)


BUILTIN_HANDLERS[sys.exc_info] = _exc_info
if hasattr(sys, "exception"):  # 3.11+
    BUILTIN_HANDLERS[sys.exception] = _exception
