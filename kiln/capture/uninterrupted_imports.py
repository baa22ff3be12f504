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
import threading

_state = threading.local()  # .depth: an import in progress on this thread with SIGINT deferred
_original = builtins.__import__  # the __import__ that `_import` calls (the one it replaced)


@contextlib.contextmanager
def imports_not_interrupted():
    """Within this block, import statements on the main thread are atomic with respect to SIGINT."""
    if threading.current_thread() is not threading.main_thread() or builtins.__import__ is _import:
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


def _import(*args, **kwargs):
    original = _original
    if getattr(_state, "depth", 0) or threading.current_thread() is not threading.main_thread():
        return original(*args, **kwargs)
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # SIG_IGN or SIG_DFL: nothing to defer
        return original(*args, **kwargs)
    pending = []
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append((signum, frame)))
    _state.depth = 1
    try:
        return original(*args, **kwargs)
    finally:
        _state.depth = 0
        signal.signal(signal.SIGINT, handler)
        if pending:
            handler(*pending[0])  # Python's default handler raises KeyboardInterrupt here
