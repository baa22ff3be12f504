"""`kiln.compile`: argument checks, then a wrapper (function) or OptimizedModule (module)."""
import functools
import warnings

import torch

from kiln import capture, config as config_mod
from kiln.backends import registry
from kiln.capture.disable import compilation_disabled
from kiln.exc import InvalidArgument

_warned_python = False


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,
            options=None, disable=False):
    """Compile `model` (a function or nn.Module), as torch.compile does.

    `model=None` returns a decorator, so `@kiln.compile` and `@kiln.compile(...)` both work.
    """
    if model is None:
        def decorator(m):
            return compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                           options=options, disable=disable)
        return decorator
    _check_arguments(model, fullgraph, dynamic, mode, options, disable)
    bound = registry.bind_backend(backend, config_mod.compiler_options(mode, options))
    if disable:
        return model
    if not config_mod.python_supported():
        return _unsupported_python(model)
    if isinstance(model, torch.nn.Module):
        return _optimized_module(model, _CompileSettings(bound, fullgraph, dynamic))
    return _wrap_function(model, capture.optimize(model, bound, fullgraph=fullgraph, dynamic=dynamic))


def _check_arguments(model, fullgraph, dynamic, mode, options, disable):
    if not callable(model):
        raise InvalidArgument(f"kiln.compile expects a function or nn.Module, got {type(model).__name__}")
    for name, value in (("fullgraph", fullgraph), ("disable", disable)):
        if not isinstance(value, bool):
            raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    if dynamic not in (None, True, False):
        raise InvalidArgument(f"dynamic must be None, True or False, got {dynamic!r}")
    if mode is not None and options is not None:
        raise InvalidArgument("give either mode or options, not both "
                              f"(mode={mode!r}, options={options!r}); see kiln.list_mode_options()")
    if mode is not None and mode not in config_mod.MODE_OPTIONS:
        raise InvalidArgument(f"unknown mode {mode!r}; modes: {', '.join(config_mod.MODE_OPTIONS)}")
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidArgument(f"options must be a dict, got {type(options).__name__}")
        unknown = sorted((k for k in options if k not in config_mod.COMPILER_OPTIONS), key=repr)
        if unknown:
            raise InvalidArgument(f"unknown option(s) {unknown}; known options: {list_options()}")
        for name, value in options.items():
            config_mod.check_value(config_mod.COMPILER_OPTIONS, "option", name, value)


def _wrap_function(fn, compiled):
    @functools.wraps(fn)
    def compiled_fn(*args, **kwargs):
        if compilation_disabled():
            return fn(*args, **kwargs)
        return compiled(*args, **kwargs)
    compiled_fn.__kiln_orig__ = fn
    compiled_fn.__kiln_compiled__ = compiled
    return compiled_fn


class _CompileSettings:
    """How a module was compiled; shared, not copied, by copies of its OptimizedModule."""

    def __init__(self, backend, fullgraph, dynamic):
        self.backend, self.fullgraph, self.dynamic = backend, fullgraph, dynamic

    def __deepcopy__(self, memo):
        return self


def _optimized_module(model, settings):
    compiled_call = capture.optimize(model, settings.backend, fullgraph=settings.fullgraph, dynamic=settings.dynamic)
    return OptimizedModule(model, compiled_call, settings)


class OptimizedModule(torch.nn.Module):
    """A compiled nn.Module: shares the original's parameters, buffers and state (as `_orig_mod`,
    as torch.compile does); its forward runs the original's `__call__` through capture, so hooks
    are honoured."""

    def __init__(self, mod, compiled_call, settings=None):
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_compiled_call"] = compiled_call  # not a submodule: state_dict stays the original's
        self.__dict__["_settings"] = settings

    def __reduce__(self):
        """copy.deepcopy (and pickle): a wrapper compiled for the copy of the module. Copying the
        compiled call itself would keep calling the original module."""
        if self._settings is None:
            return super().__reduce__()
        return _optimized_module, (self._orig_mod, self._settings)

    def forward(self, *args, **kwargs):
        if compilation_disabled():
            return self._orig_mod(*args, **kwargs)
        return self._compiled_call(*args, **kwargs)

    # the wrapper's own state; every other attribute lives on the original module
    _own_attributes = frozenset({"_orig_mod", "_compiled_call", "_settings", "forward", "__dict__"})

    @property
    def training(self):
        """The original module's mode (one flag, not two that could disagree)."""
        return self._orig_mod.training

    @training.setter
    def training(self, mode):
        orig = self.__dict__.get("_modules", {}).get("_orig_mod")
        if orig is not None:  # nn.Module.__init__ sets a default before the original is attached
            orig.training = mode

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def __setattr__(self, name, value):
        """`cm.x = v` sets x on the original module (as torch.compile's wrapper does), so the compiled
        code, which reads the original, sees it; names the wrapper's class defines stay its own."""
        if hasattr(type(self), name) or name in self._own_attributes:
            return super().__setattr__(name, value)
        return setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        if hasattr(type(self), name) or name in self._own_attributes:
            return super().__delattr__(name)
        return delattr(self._orig_mod, name)

    def __dir__(self):
        own = self._orig_mod.__dir__()
        return own + [name for name in super().__dir__() if name not in own]

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"


def _unsupported_python(model):
    global _warned_python
    import sys
    msg = (f"kiln captures CPython {config_mod.supported_pythons_text()} bytecode; "
           f"this is Python {sys.version.split()[0]}, so compiled code runs eagerly")
    if config_mod.config.error_on_unsupported_python:
        raise RuntimeError(msg)
    if not _warned_python:
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        _warned_python = True
    return model


def list_mode_options(mode=None):
    """What each mode sets (or one mode's settings)."""
    if mode is not None:
        if mode not in config_mod.MODE_OPTIONS:
            raise InvalidArgument(f"unknown mode {mode!r}; modes: {', '.join(config_mod.MODE_OPTIONS)}")
        return dict(config_mod.MODE_OPTIONS[mode])
    return {m: dict(o) for m, o in config_mod.MODE_OPTIONS.items()}


def list_options():
    """The names of the compiler options `kiln.compile(options=...)` accepts."""
    return sorted(config_mod.COMPILER_OPTIONS)


def reset():
    """Forget every compiled entry of every function (the next call compiles again)."""
    capture.reset()
