"""The frame runtime: per-code-object caches of compiled entries, guarded, thread-safe.

Hot path of a compiled call: bind arguments (a generated function with the original signature)
-> for each entry: entry.check(F, L) -> entry.run(F, L). Everything else (capture, recompile logging,
the cache-size limit) happens on a miss, under one lock.
"""
import inspect
import sys
import threading
import types
import warnings

import torch

from kiln import config as config_mod
from kiln.capture import dynamic
from kiln.capture.call_sites import original_code
from kiln.capture.convert import EagerCall, EagerFrame, compile_frame
from kiln.capture.disable import compilation_disabled, is_disabled_function
from kiln.capture.sources import CodeContext
from kiln.debug.logs import enabled, log

_LOCK = threading.RLock()
_MAX_EAGER_CALLS = 16  # capture is retried this often for calls that raise before a frame runs eagerly
_CACHES = {}       # (code, backend key, fullgraph) -> CodeCache
observers = []     # callables(code, entry) told about every new entry (kiln.explain)
eager_observers = []  # callables(code, reason) told when a frame is left to run eagerly


def _backend_key(backend):
    opts = getattr(backend, "options", None)
    return (getattr(backend, "fn", backend), tuple(sorted(opts.items())) if opts else None)


class CodeCache:
    """The compiled entries of one code object (for one backend)."""

    def __init__(self, code, backend, fullgraph, dynamic):
        self.code, self.backend, self.fullgraph, self.dynamic = code, backend, fullgraph, dynamic
        self.dynamic_dims = {}  # Source -> dims whose size changed between calls (dynamic=None)
        self.entries = []
        self.eager_reason = None
        self.warned_limit = False
        self.eager_calls = 0  # calls that raised out of the frame during capture (EagerCall)

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
            if len(self.entries) >= config_mod.config.cache_size_limit:
                if not self.warned_limit:
                    self.warned_limit = True
                    log("perf_hints", "%s recompiled %d times; raise kiln.config.cache_size_limit or make the "
                        "changing input static", self.code.co_qualname, len(self.entries))
                    warnings.warn(f"kiln: {self.code.co_qualname} ({self.code.co_filename}:{self.code.co_firstlineno}) "
                                  f"hit cache_size_limit={config_mod.config.cache_size_limit}; it now runs eagerly. "
                                  f"Last guard failure: {self._failure_text(F, L)}", RuntimeWarning, stacklevel=4)
                return None
            if self.entries:
                self._log_recompile(F, L)
                if self.dynamic is None and config_mod.config.automatic_dynamic_shapes:
                    self._note_changed_sizes(F, L)
            try:
                entry = compile_frame(F, L, self.code, self.backend, self.fullgraph, self.dynamic,
                                      self._dims_for)
            except EagerCall as e:
                self.eager_calls += 1
                log("graph_breaks", "%s", e)
                if self.eager_calls < _MAX_EAGER_CALLS:
                    return None
                self.eager_reason = f"{e} (the {_MAX_EAGER_CALLS}th call to raise during capture: no more tries)"
                log("perf_hints", "%s runs eagerly from now on: %s", self.code.co_qualname, self.eager_reason)
                return None
            except EagerFrame as e:
                self.eager_reason = str(e)
                log("graph_breaks", "%s", e)
                log("perf_hints", "%s runs eagerly from now on: %s", self.code.co_qualname, e)
                for obs in eager_observers:
                    obs(self.code, str(e))
                return None
            self.entries.append(entry)
            for obs in observers:
                obs(self.code, entry)
            return entry

    def _dims_for(self, source, tensor):
        return dynamic.dims_for(self.dynamic, self.dynamic_dims.get(source, ()), tensor, source,
                                self.code.co_qualname)

    def _note_changed_sizes(self, F, L):
        """Automatic dynamic shapes: a size that differs from a previous entry's becomes symbolic."""
        for entry in self.entries:
            for source, shape in entry.input_shapes:
                try:
                    value = _evaluate(source, F, L)
                except Exception:
                    continue
                if isinstance(value, torch.Tensor) and value.dim() == len(shape):
                    changed = {d for d, (a, b) in enumerate(zip(value.shape, shape)) if a != b}
                    dims = self.dynamic_dims.setdefault(source, set())
                    if not changed <= dims:
                        dims |= changed
                        log("dynamic", "%s: %r size changed %s -> %s: dims %s become dynamic at the recompile",
                            self.code.co_qualname, source, list(shape), list(value.shape), sorted(dims))

    def _failure_text(self, F, L):
        if not self.entries:
            return "none"
        return str(self.entries[-1].first_failure(F, L))

    def _log_recompile(self, F, L):
        if not (enabled("recompiles") or config_mod.config.verbose):
            return
        reasons = [f"    - entry {i}: {e.first_failure(F, L)}" for i, e in enumerate(self.entries)]
        msg = (f"Recompiling {self.code.co_qualname} ({self.code.co_filename}:{self.code.co_firstlineno}), "
               f"triggered by guard failure(s):\n" + "\n".join(reasons))
        log("recompiles", "%s", msg)
        if config_mod.config.verbose and not enabled("recompiles"):
            print(f"[kiln] {msg}")


def run_eagerly(cache, F, args, kwargs):
    """Run a frame capture gave up on. eager_frames replaces this with a run whose callees compile."""
    return F(*args, **kwargs)


def get_cache(code, backend, fullgraph, dynamic=None):
    code = original_code(code)  # a function made by a frame that ran rewritten shares its original's cache
    key = (code, _backend_key(backend), fullgraph, dynamic)
    cache = _CACHES.get(key)
    if cache is None:
        with _LOCK:
            cache = _CACHES.setdefault(key, CodeCache(code, backend, fullgraph, dynamic))
    return cache


def _evaluate(source, F, L):
    ctx = CodeContext()
    expr = source.expr(ctx)
    return eval(f"(lambda G: {expr})(F.__globals__)", {**ctx.consts, "F": F, "L": L})


def reset():
    with _LOCK:
        for cache in _CACHES.values():
            cache.entries.clear()
            cache.eager_reason = None
            cache.warned_limit = False
        _CACHES.clear()


def forget_backend(backend):
    """Drop the caches compiled for one backend (kiln.explain's private one)."""
    key = _backend_key(backend)
    with _LOCK:
        for k in [k for k in _CACHES if k[1] == key]:
            del _CACHES[k]


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


# ---- entry points ---------------------------------------------------------------------------------
def optimize_function(fn, backend, fullgraph, dynamic=None):
    """The compiled callable for a Python function: bind, look up, check guards, run."""
    cache = get_cache(fn.__code__, backend, fullgraph, dynamic)
    binder = make_binder(fn)
    entries = cache.entries
    F = fn

    def compiled(*args, **kwargs):
        nonlocal binder
        if binder.__defaults__ is not F.__defaults__ or binder.__kwdefaults__ is not F.__kwdefaults__:
            binder = make_binder(F)  # the user replaced the defaults
        L = binder(*args, **kwargs)
        for e in entries:
            if e.check(F, L):
                return e.run(F, L)
        return cache.miss(F, L, args, kwargs)
    compiled._kiln_cache, compiled._kiln_fn = cache, fn
    return compiled


def synthetic_caller(target):
    """A fresh function `(*args, **kwargs) -> target(*args, **kwargs)` with its own code object, so
    each compiled module/callable has its own cache and `target` is a constant of its globals."""
    ns = {"__kiln_target__": target, "__builtins__": __builtins__}
    src = "def __kiln_call__(*args, **kwargs):\n    return __kiln_target__(*args, **kwargs)\n"
    exec(compile(src, f"<kiln call {type(target).__name__} {id(target):#x}>", "exec"), ns)
    return ns["__kiln_call__"]


class Caller:
    """Calls made natively at a graph break: Python callees go through the runtime (so they are
    compiled as frames of their own), everything else is called as is."""

    def __init__(self, backend, dynamic):
        self.backend, self.dynamic = backend, dynamic

    def __call__(self, fn, /, *args, **kwargs):
        if compilation_disabled() or is_disabled_function(fn):
            return fn(*args, **kwargs)
        target, pre = fn, ()
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            target, pre = fn.__func__, (fn.__self__,)
        elif isinstance(fn, torch.nn.Module) and not _has_hooks(fn):
            forward = fn.forward
            if isinstance(forward, types.MethodType) and isinstance(forward.__func__, types.FunctionType):
                target, pre = forward.__func__, (fn,)
        if not isinstance(target, types.FunctionType) or is_library_function(target):
            return fn(*args, **kwargs)
        return self.call_function(target, *pre, *args, **kwargs)

    def call_function(self, fn, /, *args, **kwargs):
        """Run the user Python function `fn` as a frame of its own: its cache entry, compiled on a miss."""
        cache = get_cache(fn.__code__, self.backend, False, self.dynamic)
        L = _binder_for(fn)(*args, **kwargs)
        for e in cache.entries:
            if e.check(fn, L):
                return e.run(fn, L)
        return cache.miss(fn, L, args, kwargs)


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

