"""kiln's settings.

`kiln.config` holds the capture/runtime settings (cache_size_limit, suppress_errors, ...);
`COMPILER_OPTIONS` holds the defaults of the compiler options that `kiln.compile(options=...)`
and `mode=` may set, and `MODE_OPTIONS` what each mode sets.
"""
import contextlib
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
        # capture .item() into the graph (a number only the graph knows) instead of breaking there
        "capture_scalar_outputs": False,
        # dynamic=None: after a size (or an int/float argument) changes, recompile with it symbolic
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
    "freezing": (False, "treat parameters as constants (inference)"),
    "cpp.threads": (-1, "OpenMP threads for generated kernels (-1: torch.get_num_threads())"),
    "cpp.simdlen": (None, "SIMD width hint for generated loops"),
    "cpp.min_parallel_work": (32768, "elements below which a kernel runs single-threaded"),
    "triton.cudagraphs": (False, "capture GPU graphs with CUDA graphs"),
    "trace.enabled": (False, "write a debug folder per graph: fx, aten, IR, schedule, code"),
    "trace.graph_diagram": (False, "draw the fused schedule as a diagram in the debug folder"),
    "trace.debug_dir": (None, "where trace.enabled writes (default ./kiln_debug)"),
    "debug": (False, "extra checks in the compiler"),
    "graph_cache": (True, "keep compiled graphs in KILN_CACHE_DIR/graphs: a fresh process skips aot, lowering "
                          "and codegen for a graph it compiled before (inference graphs with static sizes)"),
}

MODE_OPTIONS = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True, "coordinate_descent_tuning": True},
}


def compiler_options(mode=None, options=None):
    """The full option dict for one compile: defaults, then the mode's, then the user's."""
    resolved = {name: default for name, (default, _) in COMPILER_OPTIONS.items()}
    resolved.update(MODE_OPTIONS[mode or "default"])
    resolved.update(options or {})
    return resolved


# the CPython versions whose bytecode capture runs (kiln/capture/bytecode_facts.py holds what differs
# between them); on any other version kiln.compile warns and runs the model eagerly
SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))


def python_supported():
    return sys.version_info[:2] in SUPPORTED_PYTHONS


def supported_pythons_text():
    """'3.11, 3.12 and 3.13'"""
    names = [".".join(map(str, v)) for v in SUPPORTED_PYTHONS]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
