"""The frame runtime: per-code-object caches of compiled entries, guarded, thread-safe.

Hot path of a compiled call: bind arguments (a generated function with the original signature)
-> for each entry: entry.check(F, L) -> entry.run(F, L). Everything else (capture, recompile logging,
the cache-size limit) happens on a miss, under one lock.

A cache lives as long as its code object and no longer: `_CACHES` holds code objects weakly (by
identity), and nothing a cache holds refers back to its code (the cache itself holds it weakly; guards
hold the modules, functions and classes they check weakly). A compiled function keeps its code, so
its cache, alive; a nested function's code lives in its parent's constants, so a closure made anew on
each call still finds its cache. An entry goes as soon as an object its guards check by identity dies
(guards.Liveness): it could never match again.
"""
import inspect
import sys
import threading
import types
import warnings
import weakref

import torch

from kiln.config import config as settings  # (the settings object, however kiln.config is bound)
from kiln.capture import autograd_hooks, capture_cache, dynamic as dynamic_mod, fx_sources, torch_caches
from kiln.capture.call_sites import original_code
from kiln.capture.callees import CALLEE_OVERRIDES, overridden_callee
from kiln.capture.disable import compilation_disabled, is_disabled_function
from kiln.capture.frame_filter import worth_compiling
from kiln.capture.identity_table import IdentityTable
from kiln.capture.uninterrupted_imports import imports_not_interrupted
from kiln.capture.sources import CodeContext
from kiln.debug import report
from kiln.debug.logs import enabled, log
from kiln.exc import FailOnRecompileLimitHit

_LOCK = threading.RLock()
_MAX_EAGER_CALLS = 16  # capture is retried this often for calls that raise before a frame runs eagerly
_CACHES = IdentityTable()  # code -> {(backend key, fullgraph, dynamic): CodeCache}
observers = []     # callables(code, entry) told about every new entry (kiln.explain)
eager_observers = []  # callables(code, reason) told when a frame is left to run eagerly


def _backend_key(backend):
    opts = getattr(backend, "options", None)
    return (getattr(backend, "fn", backend), tuple(sorted(opts.items())) if opts else None)


class CodeCache:
    """The compiled entries of one code object (for one backend). Holds the code object weakly, or
    `_CACHES` would keep it alive."""

    def __init__(self, code, backend, fullgraph, dynamic):
        self._code = weakref.ref(code)
        self.backend, self.fullgraph, self.dynamic = backend, fullgraph, dynamic
        self.dynamism = dynamic_mod.InputDynamism(dynamic, code.co_qualname)
        self.entries = []
        self.eager_reason = None
        self.warned_limit = False
        self.eager_calls = 0  # calls that raised out of the frame during capture (EagerCall)
        self.disk_key = False  # the capture cache's key for this frame (None: not stored), found on first use
        self.stored = None     # entries earlier processes stored, not loaded yet (capture_cache.load)

    @property
    def code(self):
        return self._code()

    def caller(self):
        """What this frame's glue calls at a graph break (runtime.Caller)."""
        return Caller(self.backend, self.dynamic)

    def __call__(self, F, L):
        """Run a frame whose bound arguments are already the tuple L (resume functions)."""
        for e in self.entries:
            if e.check(F, L):
                return e.run(F, L)
        return self.miss(F, L, L, {})

    def miss(self, F, L, args, kwargs):
        entry = self._entry_for(F, L)
        if entry is None:
            return run_eagerly(self, F, args, kwargs)
        return entry.run(F, L)

    def _entry_for(self, F, L):
        with _LOCK:
            for e in self.entries:  # another thread may have compiled it meanwhile
                if e.check(F, L):
                    return e
            if self.eager_reason is not None:
                return None
            if len(self.entries) >= settings.cache_size_limit:
                if self.fullgraph:  # fullgraph promises compiled code: no silent eager run
                    raise FailOnRecompileLimitHit(
                        f"{self.code.co_qualname} ({self.code.co_filename}:{self.code.co_firstlineno}) hit "
                        f"cache_size_limit={settings.cache_size_limit} under fullgraph=True. "
                        f"Last guard failure: {self._failure_text(F, L)}")
                if not self.warned_limit:
                    self.warned_limit = True
                    log("perf_hints", "%s recompiled %d times; raise kiln.config.cache_size_limit or make the "
                        "changing input static", self.code.co_qualname, len(self.entries))
                    warnings.warn(f"kiln: {self.code.co_qualname} ({self.code.co_filename}:{self.code.co_firstlineno}) "
                                  f"hit cache_size_limit={settings.cache_size_limit}; it now runs eagerly. "
                                  f"Last guard failure: {self._failure_text(F, L)}", RuntimeWarning, stacklevel=4)
                return None
            if self.entries:
                self._log_recompile(F, L)
                report.recompiling(self.code, self.entries, F, L, _evaluate)
                self.dynamism.note_changes(self.entries, lambda source: _evaluate(source, F, L))
            if not report.active():  # (a compile report wants what capture records)
                with autograd_hooks.hidden():  # (its backend compiles here, as compile_frame's does)
                    entry = capture_cache.load(self, F, L)  # an entry an earlier process captured, if one fits
                if entry is not None:
                    return self._adopt(entry)
            from kiln.capture.convert import EagerCall, EagerFrame, compile_frame  # capture loads on the first miss
            recording = report.frame_compiling(self.code, len(self.entries))
            try:
                with imports_not_interrupted(), fx_sources.owned() as sources, recording:
                    try:
                        capture_cache.stats.captures += 1
                        entry = compile_frame(F, L, self.code, self.backend, self.fullgraph, self.dynamism,
                                              self.caller())
                    finally:
                        torch_caches.release_finished_compiles()
                    sources.tie_to(entry)
            except EagerCall as e:
                self.eager_calls += 1
                report.frame_eager(recording, str(e))
                log("graph_breaks", "%s", e)
                if self.eager_calls < _MAX_EAGER_CALLS:
                    return None
                self.eager_reason = f"{e} (the {_MAX_EAGER_CALLS}th call to raise during capture: no more tries)"
                log("perf_hints", "%s runs eagerly from now on: %s", self.code.co_qualname, self.eager_reason)
                return None
            except EagerFrame as e:
                self.eager_reason = str(e)
                report.frame_eager(recording, str(e))
                log("graph_breaks", "%s", e)
                log("perf_hints", "%s runs eagerly from now on: %s", self.code.co_qualname, e)
                for obs in eager_observers:
                    obs(self.code, str(e))
                return None
            capture_cache.store(self, entry)
            return self._adopt(entry, recording)

    def _adopt(self, entry, recording=None):
        self._keep(entry)
        if recording is not None:
            report.entry_made(recording, entry)
        for obs in observers:
            obs(self.code, entry)
        return entry

    def _keep(self, entry):
        self.entries.append(entry)
        if entry.liveness.watches():  # weak references only: the callback must not keep either alive
            cache, kept = weakref.ref(self), weakref.ref(entry)
            entry.liveness.on_death(lambda: _discard(cache(), kept()))

    def _failure_text(self, F, L):
        if not self.entries:
            return "none"
        return str(self.entries[-1].first_failure(F, L))

    def _log_recompile(self, F, L):
        if not (enabled("recompiles") or settings.verbose):
            return
        reasons = [f"    - entry {i}: {e.first_failure(F, L)}" for i, e in enumerate(self.entries)]
        msg = (f"Recompiling {self.code.co_qualname} ({self.code.co_filename}:{self.code.co_firstlineno}), "
               f"triggered by guard failure(s):\n" + "\n".join(reasons))
        log("recompiles", "%s", msg)
        if settings.verbose and not enabled("recompiles"):
            print(f"[kiln] {msg}")


def run_eagerly(cache, F, args, kwargs):
    """Run a frame capture gave up on. eager_frames replaces this with a run whose callees compile."""
    return F(*args, **kwargs)


def _discard(cache, entry):
    """Drop an entry whose guards can no longer pass (an object they check by identity died)."""
    if cache is not None and entry is not None:
        try:
            cache.entries.remove(entry)  # in place: hot paths iterate this very list
        except ValueError:
            pass


def get_cache(code, backend, fullgraph, dynamic=None):
    return _cache_for(code, (_backend_key(backend), fullgraph, dynamic), backend)


def _cache_for(code, key, backend):
    code = original_code(code)  # a function made by a frame that ran rewritten shares its original's cache
    found = _CACHES.get(code)
    cache = found.get(key) if found is not None else None
    if cache is None:
        with _LOCK:
            found = _CACHES.setdefault(code, dict)
            cache = found.get(key)
            if cache is None:
                cache = found[key] = CodeCache(code, backend, key[1], key[2])
    return cache


def _evaluate(source, F, L):
    ctx = CodeContext()
    expr = source.expr(ctx)
    return eval(f"(lambda G: {expr})(F.__globals__)", {**ctx.consts, "F": F, "L": L})


def reset():
    with _LOCK:
        for caches in _CACHES.values():
            for cache in caches.values():
                cache.entries.clear()
                cache.eager_reason = None
                cache.warned_limit = False
        _CACHES.clear()


def forget_backend(backend):
    """Drop the caches compiled for one backend (kiln.explain's private one): they would otherwise
    live as long as the code objects they were compiled for."""
    key = _backend_key(backend)
    with _LOCK:
        for caches in _CACHES.values():
            for k in [k for k in caches if k[0] == key]:
                del caches[k]


# ---- argument binding -----------------------------------------------------------------------------
def make_binder(fn):
    """A function with fn's signature returning its parameters in co_varnames order (C-speed binding).
    Its code depends only on the shape of the signature, so it is made once per shape (closures made
    anew on every call cost a function object, not a compile)."""
    code = fn.__code__
    nparams = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + \
        bool(code.co_flags & inspect.CO_VARKEYWORDS)
    names = code.co_varnames[:nparams]
    shape = (names, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
             code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS), len(fn.__defaults__ or ()),
             tuple(fn.__kwdefaults__ or ()))
    binder_code = _BINDER_CODES.get(shape)
    if binder_code is None:
        src = (f"def binder{inspect.signature(_no_annotations(fn))}:\n"
               f"    return ({''.join(n + ', ' for n in names)})\n")
        ns = {}
        exec(compile(src, "<kiln binder>", "exec"), ns)
        binder_code = _BINDER_CODES.setdefault(shape, ns["binder"].__code__)
    binder = types.FunctionType(binder_code, _BINDER_GLOBALS, "binder", fn.__defaults__)
    binder.__kwdefaults__ = fn.__kwdefaults__
    return binder


_BINDER_CODES = {}  # signature shape -> binder code object
_BINDER_GLOBALS = {"__builtins__": __builtins__}


def _no_annotations(fn):
    clone = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    sig = inspect.signature(clone)
    params = [p.replace(annotation=inspect.Parameter.empty,
                        default=p.default if p.default is inspect.Parameter.empty else _Default(p.name))
              for p in sig.parameters.values()]
    clone.__signature__ = sig.replace(parameters=params, return_annotation=inspect.Signature.empty)
    return clone


class _Default:
    """Renders a default as a placeholder in the binder source; the real defaults are set afterwards."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "None"


jit_tracing = torch._C._get_tracing_state  # not None while torch.jit.trace runs


# ---- entry points ---------------------------------------------------------------------------------
def optimize_function(fn, backend, fullgraph, dynamic=None):
    """The compiled callable for a Python function: bind, look up, check guards, run."""
    cache = get_cache(fn.__code__, backend, fullgraph, dynamic)
    binder = make_binder(fn)
    entries = cache.entries
    F = fn
    code = fn.__code__  # the cache holds it weakly; this function owns it (F.__code__ may be replaced)

    def compiled(*args, **kwargs):
        nonlocal binder
        if jit_tracing():  # the trace would record the compiled graph's kernels as opaque calls, or nothing
            raise RuntimeError(f"torch.jit.trace of a kiln-compiled function ({code.co_qualname}) is not "
                               "supported: trace the original function")
        if binder.__defaults__ is not F.__defaults__ or binder.__kwdefaults__ is not F.__kwdefaults__:
            binder = make_binder(F)  # the user replaced the defaults
        L = binder(*args, **kwargs)
        for e in entries:
            if e.check(F, L):
                return e.run(F, L)
        return cache.miss(F, L, args, kwargs)
    compiled._kiln_cache, compiled._kiln_fn, compiled._kiln_code = cache, fn, code
    return compiled


class Caller:
    """Calls made natively at a graph break: Python callees go through the runtime (so they are
    compiled as frames of their own), everything else is called as is."""

    def __init__(self, backend, dynamic):
        self.backend, self.dynamic = backend, dynamic
        self._key = (_backend_key(backend), False, dynamic)

    def __call__(self, fn, /, *args, **kwargs):
        if compilation_disabled():
            return fn(*args, **kwargs)
        if CALLEE_OVERRIDES and (override := overridden_callee(self, fn)) is not None:
            return override(*args, **kwargs)
        target, pre = fn, ()
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            target, pre = fn.__func__, (fn.__self__,)
        elif isinstance(fn, torch.nn.Module) and not _has_hooks(fn) and \
                type(fn).__call__ is torch.nn.Module.__call__:  # else the class's own __call__ runs
            forward = fn.forward
            if isinstance(forward, types.MethodType) and isinstance(forward.__func__, types.FunctionType):
                target, pre = forward.__func__, (fn,)
        if is_disabled_function(target):  # (also a module's disabled forward)
            shallow = getattr(target, "__kiln_shallow__", None)  # disable(recursive=False): its callees compile
            if shallow is None:
                return fn(*args, **kwargs)
            return run_eagerly(_cache_for(shallow.__code__, self._key, self.backend), shallow, (*pre, *args), kwargs)
        if not isinstance(target, types.FunctionType) or is_library_function(target):
            return fn(*args, **kwargs)
        return self.call_function(target, *pre, *args, **kwargs)

    def call_function(self, fn, /, *args, **kwargs):
        """Run the user Python function `fn` as a frame of its own: its cache entry, compiled on a miss
        (natively when it computes nothing a graph could hold: frame_filter)."""
        if not worth_compiling(fn, args, kwargs):
            return fn(*args, **kwargs)
        cache = _cache_for(fn.__code__, self._key, self.backend)
        L = _binder_for(fn)(*args, **kwargs)
        for e in cache.entries:
            if e.check(fn, L):
                return e.run(fn, L)
        return cache.miss(fn, L, args, kwargs)

    def resume_cache(self, rcode):
        """The cache a resume function's code runs through (compiled on a miss, as a frame of its own)."""
        return _cache_for(rcode, self._key, self.backend)

    @staticmethod
    def cached_code(value):
        """The code object of `value` when it is a frame's cache (a CodeCache), else None."""
        return value.code if isinstance(value, CodeCache) else None


def _binder_for(fn):
    binder = fn.__dict__.get("__kiln_binder__")
    if binder is None or binder.__defaults__ is not fn.__defaults__:
        binder = make_binder(fn)
        fn.__dict__["__kiln_binder__"] = binder
    return binder


def _has_hooks(mod):
    return bool(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or mod._backward_pre_hooks)


def is_library_function(fn):
    """Functions that run natively instead of as compiled frames: torch's, the standard library's and
    kiln's own (torch.compile skips torch and the standard library too)."""
    mod = getattr(fn, "__module__", None) or ""
    found = _LIBRARY_MODULES.get(mod)
    if found is None:
        top = mod.split(".")[0]
        found = _LIBRARY_MODULES[mod] = top in ("torch", "kiln") or top in sys.stdlib_module_names
    return found


_LIBRARY_MODULES = {}  # module name -> is_library_function's answer

