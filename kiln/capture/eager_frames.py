"""Frames that run eagerly still compile their callees.

When capture gives up on a frame (a break inside a loop or a with-block, a generator, the cache-size
limit, an internal error), the frame runs as a rewritten copy of its code (call_sites.py) whose call
sites pass each callable through a `Callees` resolver first: a Python function, method, callable
object or `nn.Module` from user code is swapped for one that runs it through kiln's runtime (its own
cache entry, compiled on a miss, exactly as the glue's `Caller` does); anything else (builtins,
classes, torch, the standard library, kiln itself) is called natively, untouched. That is what
torch.compile's frame hook does for the callees of a frame it skips.

A module call runs a rewritten copy of its class's `Module._call_impl`, so its hooks run exactly as
PyTorch runs them and its `forward` and hooks are themselves callees that compile.

Why rewritten bytecode rather than a PEP 523 frame hook: it is pure Python (no C extension built per
CPython version against its internal frame structs), the version differences stay in call_sites'
table, and a frame that is not skipped pays nothing. The cost is a small per-call overhead inside a
skipped frame (measured in the worktree README), and that library code run natively does not compile
the user functions it calls back (a frame hook would).
"""
import functools
import os
import types
import weakref

import torch

from kiln.capture import callees, runtime
from kiln.capture.call_sites import CannotRewrite, original_code, rewrite_calls
from kiln.capture.disable import compilation_disabled, is_disabled_function
from kiln.capture.runtime import is_library_function
from kiln.debug.logs import log

_MODULE_CALL = torch.nn.Module.__call__
_CALL_IMPL = torch.nn.Module._call_impl
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: classes made by `class` statements (at run time)
# Comprehensions run as part of the frame that made them (CPython 3.12 inlines them): they run their
# rewritten code, never a cache entry of their own.
_COMPREHENSIONS = {"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"}
_REWRITTEN = weakref.WeakKeyDictionary()  # CodeCache -> (rewritten code, or None when it cannot be)
_CALLEES = weakref.WeakValueDictionary()  # (backend key, dynamic) -> Callees, while a rewritten code uses it


def run_eagerly(cache, F, args, kwargs):
    """Run the frame of `F` (whose cache is `cache`) eagerly, with its callees compiled."""
    code = F.__code__
    if code is not cache.code or compilation_disabled():
        return F(*args, **kwargs)
    found = _REWRITTEN.get(cache)
    if found is None:
        found = _REWRITTEN.setdefault(cache, (_rewrite(cache),))
    rewritten = found[0]
    if rewritten is None:
        return F(*args, **kwargs)
    G = types.FunctionType(rewritten, F.__globals__, F.__name__, F.__defaults__, F.__closure__)
    G.__kwdefaults__ = F.__kwdefaults__
    return G(*args, **kwargs)


def _rewrite(cache):
    code = cache.code
    rewritten = _rewritten_code(code, _callees_for(cache.backend, cache.dynamic).resolve)
    if rewritten is not None:
        log("graph_breaks", "%s (%s:%d) runs eagerly; the functions and modules it calls are still compiled",
            code.co_qualname, code.co_filename, code.co_firstlineno)
    return rewritten


def _rewritten_code(code, resolve):
    """rewrite_calls(code, resolve), or None where it cannot (the code then runs as it is, never wrongly)."""
    try:
        return rewrite_calls(code, resolve)
    except Exception as e:  # CannotRewrite, or a bug in the rewrite
        if os.environ.get("KILN_DEBUG") and not isinstance(e, CannotRewrite):
            raise
        log("graph_breaks", "%s runs eagerly, and so do its callees: %s", code.co_qualname, e)
        return None


def _callees_for(backend, dynamic):
    """One Callees per backend (as the runtime keys caches) and `dynamic`, shared by the frames that use it."""
    key = (runtime._backend_key(backend), dynamic)
    callees = _CALLEES.get(key)
    if callees is None:
        callees = _CALLEES.setdefault(key, Callees(backend, dynamic))
    return callees


class Callees:
    """What the call sites of a skipped frame call: `resolve(f)` is `f` itself, or a stand-in that
    runs `f` through the runtime with this backend."""

    def __init__(self, backend, dynamic):
        self.caller = runtime.Caller(backend, dynamic)
        self.call_impl = None  # Module._call_impl, rewritten (made on the first module call)
        # type -> plan (None: call natively), for types that are not heap types: classes made at run
        # time are planned on each call instead, so this table cannot keep them alive
        plans = {types.FunctionType: self.function, types.MethodType: self.method}
        plans_get, missing, plan_for = plans.get, object(), self._plan_for

        def resolve(f):
            plan = plans_get(type(f), missing)
            if plan is missing:
                plan = plan_for(type(f), plans)
            if plan is None:
                return f
            try:
                return plan(f)
            except Exception:  # a bug here must not change what the program computes
                return f
        self.resolve = resolve

    def _plan_for(self, cls, plans):
        if not cls.__flags__ & _HEAP_TYPE:
            plans[cls] = None
            return None
        if issubclass(cls, type):
            return None
        if issubclass(cls, torch.nn.Module):
            return self.module
        if type(getattr(cls, "__call__", None)) is types.FunctionType:
            return self.callable_object
        return None

    def function(self, f):
        if is_library_function(f) and callees.CALLEE_OVERRIDES:  # library code whose callees still compile
            return callees.overridden_callee(self.caller, f) or f
        if is_library_function(f) or compilation_disabled() or is_disabled_function(f) or \
                original_code(f.__code__).co_name in _COMPREHENSIONS:
            return f
        return functools.partial(self.caller.call_function, f)

    def method(self, m):
        func = m.__func__
        if type(func) is not types.FunctionType:
            return m
        if callees.CALLEE_OVERRIDES and (override := callees.overridden_callee(self.caller, m)) is not None:
            return override
        callee = self.function(func)
        return m if callee is func else types.MethodType(callee, m.__self__)

    def module(self, mod):
        if callees.CALLEE_OVERRIDES and (override := callees.overridden_callee(self.caller, mod)) is not None:
            return override
        cls = type(mod)
        if cls.__call__ is not _MODULE_CALL:
            return self.callable_object(mod)
        if cls._call_impl is not _CALL_IMPL or getattr(mod, "_compiled_call_impl", None) is not None:
            return mod  # a _call_impl of its own, or torch.compile's
        if self.call_impl is None:
            self.call_impl = _rewritten_function(_CALL_IMPL, self.resolve)
        return types.MethodType(self.call_impl, mod)

    def callable_object(self, obj):
        call = type(obj).__call__
        if type(call) is not types.FunctionType:
            return obj
        callee = self.function(call)
        return obj if callee is call else types.MethodType(callee, obj)


def _rewritten_function(fn, resolve):
    """A copy of `fn` whose calls go through `resolve` (fn itself if its code cannot be rewritten)."""
    code = _rewritten_code(fn.__code__, resolve)
    if code is None:
        return fn
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


runtime.run_eagerly = run_eagerly
