"""kiln's settings.

`kiln.config` holds the capture/runtime settings (cache_size_limit, suppress_errors, ...);
`COMPILER_OPTIONS` holds the compiler options that `kiln.compile(options=...)` and `mode=` may set
(default, what it does, the values it accepts), and `MODE_OPTIONS` what each mode sets. Both tables
say what values they accept, and a wrong one is refused where it is given, naming the option and
what it expects (kiln.InvalidArgument), never later inside the compiler.
"""
import contextlib
import dataclasses
import os
import sys

from kiln.exc import InvalidArgument


@dataclasses.dataclass(frozen=True)
class Option:
    """A setting: its default, what it does, and the values it accepts."""
    default: object
    doc: str
    kind: type = bool            # bool, int, os.PathLike (a str or path) or dict (str -> one of `choices`)
    minimum: int | None = None   # ints: the smallest value accepted
    also: tuple = ()             # other values accepted besides those of `kind` (None, -1)
    choices: tuple = ()          # dicts: the values accepted

    def accepts(self, value):
        if any(value is v or type(value) is type(v) and value == v for v in self.also):
            return True
        if self.kind is bool:
            return type(value) is bool
        if self.kind is int:
            return type(value) is int and (self.minimum is None or value >= self.minimum)
        if self.kind is dict:
            value = dict(value) if isinstance(value, tuple) else value  # (the form compiler_options holds)
            return isinstance(value, dict) and all(isinstance(k, str) and v in self.choices for k, v in value.items())
        return isinstance(value, (str, os.PathLike))

    def expected(self):
        if self.kind is bool:
            text = "True or False"
        elif self.kind is int:
            text = "an int" + (f" >= {self.minimum}" if self.minimum is not None else "")
        elif self.kind is dict:
            text = "a dict from device type (str) to one of " + ", ".join(map(repr, self.choices))
        else:
            text = "a path (str or os.PathLike)"
        return text + "".join(f" or {v!r}" for v in self.also)


def check_value(table, what, name, value):
    """Raise InvalidArgument unless `value` is one that option `name` of `table` accepts."""
    option = table[name]
    if not option.accepts(value):
        raise InvalidArgument(f"{what} {name!r} must be {option.expected()}, got {value!r} "
                              f"({type(value).__name__})")


class _Config:
    """Settings with a `patch` that works as a context manager and as a decorator."""

    _settings = {
        "cache_size_limit": Option(64, "most compiled entries kept per code object; past that the frame runs "
                                       "eagerly", int, minimum=0),
        "suppress_errors": Option(False, "a backend that raises: False re-raises (wrapped), True runs the frame "
                                         "eagerly with a warning"),
        "inline_inbuilt_nn_modules": Option(True, "inline calls to user functions into the caller's graph"),
        "capture_scalar_outputs": Option(False, "capture .item() into the graph (a number only the graph knows) "
                                                "instead of breaking there"),
        "automatic_dynamic_shapes": Option(True, "dynamic=None: after a size (or an int/float argument) changes, "
                                                 "recompile with it symbolic"),
        "error_on_unsupported_python": Option(False, "raise instead of running eagerly when the Python version "
                                                     "is not supported"),
        "optimize_ddp": Option(True, "under DistributedDataParallel, compile each graph as one graph per gradient "
                                     "bucket, so a bucket's all-reduce overlaps the rest of the backward"),
        "capture_cache": Option(os.environ.get("KILN_CAPTURE_CACHE", "1") != "0",
                                "keep captured frames (guards, glue, graph) in KILN_CACHE_DIR/capture: a fresh process "
                                "that meets a frame it compiled before skips capture (KILN_CAPTURE_CACHE=0: off)"),
        "verbose": Option(False, "print a guard-failure reason when recompiling (also under "
                                 "KILN_LOGS=recompiles)"),
    }

    def __init__(self):
        object.__setattr__(self, "_values", {name: o.default for name, o in self._settings.items()})

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"kiln.config has no setting {name!r}; settings: {sorted(self._values)}") from None

    def __setattr__(self, name, value):
        self._check(name, value)
        self._values[name] = value

    def _check(self, name, value):
        if name not in self._values:
            raise AttributeError(f"kiln.config has no setting {name!r}; settings: {sorted(self._values)}")
        check_value(self._settings, "kiln.config setting", name, value)

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
        for name, value in changes.items():
            self._check(name, value)  # unknown names and wrong values fail here, before anything changes
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

# Compiler options: name -> Option. `kiln.list_options()` lists the names.
COMPILER_OPTIONS = {
    "epilogue_fusion": Option(True, "fuse pointwise consumers into reductions"),
    "max_autotune": Option(False, "benchmark each Triton kernel's candidate block configs at its first call per "
                                  "size and keep the fastest (on disk, KILN_CACHE_DIR/autotune); no effect on "
                                  "C++ kernels: see INERT_OPTIONS"),
    "coordinate_descent_tuning": Option(False, "tune each Triton kernel launch's blocks and warps at its first call "
                                               "per size by coordinate descent (one knob at a time, from the "
                                               "heuristic's config or max_autotune's pick), kept on disk "
                                               "(KILN_CACHE_DIR/autotune); no effect on C++ kernels: see INERT_OPTIONS"),
    "fallback_random": Option(False, "run random ops through aten so results equal eager under one seed"),
    "shape_padding": Option(False, "pad matmul shapes to faster sizes (accepted; no effect on CPU yet: see "
                                   "INERT_OPTIONS)"),
    "layout_optimization": Option(True, "run 2-d convolutions of inference graphs on channels-last memory "
                                        "(CPU, oneDNN), their epilogues too; outputs keep eager's layout"),
    "freezing": Option(False, "treat parameters as constants (inference)"),
    "cpp.threads": Option(-1, "OpenMP threads for generated kernels (-1: torch.get_num_threads())", int,
                          minimum=1, also=(-1,)),
    "cpp.simdlen": Option(None, "SIMD width hint for generated loops", int, minimum=1, also=(None,)),
    "cpp.min_parallel_work": Option(32768, "elements below which a kernel runs single-threaded", int, minimum=0),
    "device_backend": Option((), "which kernel backend compiles each device type's kernels, over the default "
                                 "{'cpu': 'cpp', 'cuda': 'triton'}; {'cpu': 'triton'} sends CPU graphs through Triton "
                                 "(its interpreter, TRITON_INTERPRET=1: tests); a device without a backend runs through "
                                 "aten. Default from KILN_DEVICE_BACKEND=cpu:triton", dict, choices=("cpp", "triton")),
    "triton.cudagraphs": Option(False, "replay compiled CUDA graphs (inference; training forward and backward) as "
                                       "CUDA graphs (mode='reduce-overhead'; no effect on CPU graphs)"),
    "trace.enabled": Option(False, "write a debug folder per graph: fx, aten, IR, schedule, code"),
    "trace.graph_diagram": Option(False, "with trace.enabled: draw the fx graph and the fused schedule as SVG in "
                                          "the debug folder (needs graphviz)"),
    "trace.debug_dir": Option(None, "where trace.enabled writes (default ./kiln_debug)", os.PathLike, also=(None,)),
    "debug": Option(False, "extra checks in the compiler"),
    "debug_bounds_checks": Option(False, "generated kernels check every load and store against their buffer and "
                                         "raise naming it (a kiln bug) instead of touching other memory; the "
                                         "default is on when the environment sets KILN_BOUNDS_CHECK=1"),
    "graph_cache": Option(True, "keep compiled graphs in KILN_CACHE_DIR/graphs: a fresh process skips aot, "
                                "lowering and codegen for a graph it compiled before (inference graphs with static "
                                "sizes)"),
}

# Options kiln accepts (programs written for torch.compile pass them) but that change nothing it
# compiles on CPU; each compile that sets one says so in one perf_hints line, with the reason.
INERT_OPTIONS = {
    "max_autotune": "C++ kernels have one variant per fused group (it tunes Triton kernels' blocks) and "
                    "kiln calls aten's own CPU matmul and convolution choices (MKL/oneDNN pick their "
                    "kernels per shape at run time), so there is nothing yet to benchmark against",
    "coordinate_descent_tuning": "it tunes launch parameters of Triton kernels (block sizes, warps); C++ "
                                 "kernels have none: gcc vectorizes each loop at the machine's width",
    "shape_padding": "MKL's CPU matmul gains nothing measurable from padded sizes at the shapes kiln "
                     "sees, and the copies a padded operand needs cost more",
    "triton.cudagraphs": "CUDA graphs exist only on GPUs; the CPU graph runs as it would without it",
}


def inert_options_set(options):
    """[(name, why it does nothing)] for each INERT_OPTIONS entry that `options` turns on."""
    return [(name, why) for name, why in INERT_OPTIONS.items() if options.get(name)]


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


def device_backend_default():
    """device_backend when no option sets it: KILN_DEVICE_BACKEND=cpu:triton[,cuda:triton] in the
    environment (how a whole test run sends CPU graphs through Triton's interpreter)."""
    text = os.environ.get("KILN_DEVICE_BACKEND", "")
    pairs = [item.split(":", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise InvalidArgument(f"KILN_DEVICE_BACKEND must read device:backend[,device:backend], got {text!r}")
    mapping = {device.strip(): backend.strip() for device, backend in pairs}
    check_value(COMPILER_OPTIONS, "KILN_DEVICE_BACKEND", "device_backend", mapping)
    return tuple(sorted(mapping.items()))


def compiler_options(mode=None, options=None):
    """The full option dict for one compile: defaults, then the mode's, then the user's."""
    resolved = {name: option.default for name, option in COMPILER_OPTIONS.items()}
    resolved["debug_bounds_checks"] = bounds_checks_default()
    resolved["device_backend"] = device_backend_default()
    resolved.update(MODE_OPTIONS[mode or "default"])
    resolved.update(options or {})
    for name, option in COMPILER_OPTIONS.items():  # held as sorted pairs: options key caches, so hashable
        if option.kind is dict and isinstance(resolved[name], dict):
            resolved[name] = tuple(sorted(resolved[name].items()))
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
