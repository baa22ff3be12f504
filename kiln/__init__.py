"""kiln: torch.compile, rebuilt from scratch in Python."""
from kiln import cache
from kiln.api import OptimizedModule, compile, list_mode_options, list_options, reset
from kiln.backends import list_backends, register_backend
from kiln.capture.disable import disable
from kiln.capture.dynamic import mark_dynamic, mark_static
from kiln.config import config
from kiln.exc import (BackendCompilerFailed, ConstraintViolation, FailOnRecompileLimitHit, InternalError,
                      InvalidArgument, InvalidBackend, KilnError, Unsupported)


def explain(fn, *args, **kwargs):
    """`kiln.explain(fn)(*args)`: compile `fn` on those arguments and report graphs, breaks, guards."""
    from kiln.debug.explain import explain as _explain
    return _explain(fn, *args, **kwargs)


def report(path=None):
    """`with kiln.report("out.html") as data:` records what kiln compiles in the block and writes a
    one-page HTML compile report (a directory gets kiln_report_<pid>.html; None writes nothing).
    `data` is the report's data (kiln.debug.report_data.Report). KILN_REPORT=DIR records the
    whole process."""
    from kiln.debug.report import report as _report
    return _report(path)


__all__ = ["cache", "compile", "config", "disable", "explain", "list_backends", "list_mode_options", "list_options",
           "mark_dynamic", "mark_static", "register_backend", "report", "reset", "OptimizedModule", "BackendCompilerFailed",
           "ConstraintViolation", "FailOnRecompileLimitHit", "InternalError", "InvalidArgument", "InvalidBackend",
           "KilnError", "Unsupported"]
__version__ = "0.1.0"

from kiln.debug.report import start_from_environment as _start_report  # noqa: E402

_start_report()  # KILN_REPORT=DIR
