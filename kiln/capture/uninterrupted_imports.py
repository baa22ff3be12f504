"""Ctrl-C during a compile never splits an import.

A first compile imports a lot lazily (kiln's own compiler modules; torch imports torch._dynamo's
package from inside FakeTensorMode). A KeyboardInterrupt that lands in the middle of a package's
`__init__` leaves its finished submodules in sys.modules with no parent to hang on: the package
imports again later, but without those attributes (`module 'torch._dynamo' has no attribute
'utils'`), and every later compile in the process fails. Removing the orphans so they import again
is no cure either (their second run re-registers global state, which torch refuses).

So while a compile runs on the main thread, each import statement runs with SIGINT deferred: the
signal is recorded and delivered (to the handler that was installed) as soon as the outermost
import finishes. The compile is still interrupted, promptly, between imports; it just never leaves
an import half done.
"""
import builtins
import contextlib
import signal
import sys
import threading
from _thread import get_ident

_state = threading.local()  # .depth: an import in progress on this thread with SIGINT deferred
_MAIN_THREAD = threading.main_thread().ident
_MODULES = sys.modules
_original = builtins.__import__  # the __import__ that `_import` calls (the one it replaced)


@contextlib.contextmanager
def imports_not_interrupted():
    """Within this block, import statements on the main thread are atomic with respect to SIGINT."""
    if get_ident() != _MAIN_THREAD or builtins.__import__ is _import:
        yield  # other threads never receive KeyboardInterrupt; nested: already on
        return
    global _original
    original = _original = builtins.__import__
    builtins.__import__ = _import
    try:
        yield
    finally:
        if builtins.__import__ is _import:  # someone else's replacement stays theirs
            builtins.__import__ = original


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    # the common case, an import of a module already there, costs one lookup (compiles run ~1000
    # import statements, nearly all of them in torch's functions)
    if getattr(_state, "depth", 0) or get_ident() != _MAIN_THREAD or _already_imported(name, globals, fromlist, level):
        return _original(name, globals, locals, fromlist, level)
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # SIG_IGN or SIG_DFL: nothing to defer
        return _original(name, globals, locals, fromlist, level)
    pending = []
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append((signum, frame)))
    _state.depth = 1
    try:
        return _original(name, globals, locals, fromlist, level)
    finally:
        _state.depth = 0
        signal.signal(signal.SIGINT, handler)
        if pending:
            handler(*pending[0])  # Python's default handler raises KeyboardInterrupt here


def _already_imported(name, globals, fromlist, level):
    """The module, and each name taken from it, is there: the import statement only looks it up."""
    if level:
        package = globals.get("__package__") if isinstance(globals, dict) else None
        parts = package.rsplit(".", level - 1) if package else ()
        if len(parts) < level:
            return False
        name = f"{parts[0]}.{name}" if name else parts[0]
    module = _MODULES.get(name)
    if module is None:
        return False
    if fromlist:
        for item in fromlist:
            if item != "*" and not hasattr(module, item):
                return False
    return True
