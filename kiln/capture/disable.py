"""`kiln.disable`: functions that always run eagerly, and the per-thread switch they flip.

While a disabled function runs (recursive=True), compiled functions it calls run eagerly too.
Capture treats a call to a disabled function as a graph break.
"""
import functools
import threading


class _State(threading.local):
    depth = 0  # a class default: reading it needs no failed attribute lookup (this is on every call)


_state = _State()


def compilation_disabled():
    """True while the current thread is inside a `kiln.disable`d function."""
    return _state.depth > 0


def is_disabled_function(fn):
    return getattr(fn, "__kiln_disabled__", False)


def disable(fn=None, recursive=True):
    """Make `fn` always run eagerly (decorator or call). `recursive=False` only skips `fn`'s own frame."""
    if fn is None:
        return lambda f: disable(f, recursive=recursive)
    if not callable(fn):
        from kiln.exc import InvalidArgument
        raise InvalidArgument(f"kiln.disable expects a callable, got {type(fn).__name__}")
    orig = getattr(fn, "__kiln_orig__", fn)  # disabling a compiled function disables the original

    if not recursive:
        @functools.wraps(orig)
        def shallow(*args, **kwargs):
            return orig(*args, **kwargs)
        shallow.__kiln_disabled__ = True
        shallow.__kiln_shallow__ = orig  # what runs eagerly (the runtime compiles its callees)
        return shallow

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        _state.depth += 1
        try:
            return orig(*args, **kwargs)
        finally:
            _state.depth -= 1
    wrapper.__kiln_disabled__ = True
    return wrapper
