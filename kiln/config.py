"""kiln's settings.

`kiln.config` holds the capture/runtime settings (cache_size_limit, suppress_errors, ...);
`COMPILER_OPTIONS` holds the defaults of the compiler options that `kiln.compile(options=...)`
and `mode=` may set, and `MODE_OPTIONS` what each mode sets.
"""
import contextlib
import os
import sys


class _Config:
    """Settings with a `patch` that works as a context manager and as a decorator."""

    _defaults = {
        # most compiled entries kept per code object; past that the frame runs eagerly
        "cache_size_limit": 64,
        # a backend that raises: False re-raises (wrapped), True runs the frame eagerly with a warning
        "suppress_errors": False,
        # inline calls to user functions into the caller's graph
        "inline_inbuilt_nn_modules": True,
        # capture .item() into the graph instead of breaking (not yet supported: breaks)
        "capture_scalar_outputs": False,
        # dynamic=None: after a size changes, recompile with that dim symbolic
        "automatic_dynamic_shapes": True,
        # raise instead of running eagerly when the Python version is not supported
        "error_on_unsupported_python": False,
        # print a guard-failure reason when recompiling (also under KILN_LOGS=recompiles)
        "verbose": False,
    }

    def __init__(self):
        object.__setattr__(self, "_values", dict(self._defaults))

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"kiln.config has no setting {name!r}; settings: {sorted(self._values)}") from None

    def __setattr__(self, name, value):
        if name not in self._values:
            raise AttributeError(f"kiln.config has no setting {name!r}; settings: {sorted(self._values)}")
        self._values[name] = value

    def __dir__(self):
        return sorted(self._values)

    def as_dict(self):
        return dict(self._values)

    def patch(self, arg=None, value=None, **changes):
        """`with kiln.config.patch(cache_size_limit=2): ...`, `@kiln.config.patch("verbose", True)`."""
        if isinstance(arg, dict):
            changes.update(arg)
        elif arg is not None:
            changes[arg] = value
        for name in changes:
            getattr(self, name)  # unknown names fail here, before anything changes
        return _Patch(self, changes)


class _Patch(contextlib.ContextDecorator):
    def __init__(self, config, changes):
        self.config, self.changes, self.saved = config, changes, []

    def __enter__(self):
        self.saved.append({k: getattr(self.config, k) for k in self.changes})
        for k, v in self.changes.items():
            setattr(self.config, k, v)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.pop().items():
            setattr(self.config, k, v)
        return False


config = _Config()

# Compiler options: name -> (default, what it does). `kiln.list_options()` lists the names.
COMPILER_OPTIONS = {
    "epilogue_fusion": (True, "fuse pointwise consumers into reductions"),
    "max_autotune": (False, "benchmark candidate kernels and keep the fastest"),
    "coordinate_descent_tuning": (False, "tune kernel parameters by coordinate descent"),
    "fallback_random": (False, "run random ops through aten so results equal eager under one seed"),
    "shape_padding": (False, "pad matmul shapes to faster sizes"),
    "layout_optimization": (True, "run 2-d convolutions of inference graphs on channels-last memory (CPU, "
                                  "oneDNN), their epilogues too; outputs keep eager's layout"),
    "freezing": (False, "treat parameters as constants (inference)"),
    "cpp.threads": (-1, "OpenMP threads for generated kernels (-1: torch.get_num_threads())"),
    "cpp.simdlen": (None, "SIMD width hint for generated loops"),
    "cpp.min_parallel_work": (32768, "elements below which a kernel runs single-threaded"),
    "triton.cudagraphs": (False, "capture GPU graphs with CUDA graphs"),
    "trace.enabled": (False, "write a debug folder per graph: fx, aten, IR, schedule, code"),
    "trace.graph_diagram": (False, "draw the fused schedule as a diagram in the debug folder"),
    "trace.debug_dir": (None, "where trace.enabled writes (default ./kiln_debug)"),
    "debug": (False, "extra checks in the compiler"),
    "debug_bounds_checks": (False, "generated kernels check every load and store against their buffer and raise "
                                   "naming it (a kiln bug) instead of touching other memory; the default is on "
                                   "when the environment sets KILN_BOUNDS_CHECK=1"),
    "graph_cache": (True, "keep compiled graphs in KILN_CACHE_DIR/graphs: a fresh process skips aot, lowering "
                          "and codegen for a graph it compiled before (inference graphs with static sizes)"),
}

MODE_OPTIONS = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True, "coordinate_descent_tuning": True},
}


def bounds_checks_default():
    """debug_bounds_checks when no option sets it: KILN_BOUNDS_CHECK=1 in the environment (read when
    compiling, so a test run can turn it on for every compile)."""
    return os.environ.get("KILN_BOUNDS_CHECK", "") not in ("", "0")


def compiler_options(mode=None, options=None):
    """The full option dict for one compile: defaults, then the mode's, then the user's."""
    resolved = {name: default for name, (default, _) in COMPILER_OPTIONS.items()}
    resolved["debug_bounds_checks"] = bounds_checks_default()
    resolved.update(MODE_OPTIONS[mode or "default"])
    resolved.update(options or {})
    return resolved


SUPPORTED_PYTHON = (3, 11)


def python_supported():
    return sys.version_info[:2] == SUPPORTED_PYTHON
