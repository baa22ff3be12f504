"""The Triton kernel backend: kernels on CUDA memory, or on CPU memory under Triton's interpreter
(TRITON_INTERPRET=1, how it is tested without a GPU). Each kernel is a @triton.jit function
(codegen/triton_kernels), the graph's kernels one Python module written to the kiln cache and
imported; the wrapper launches each with the tensors it touches and the sizes it needs."""
import hashlib
import importlib.util
import re
import sys

import sympy

from kiln.compiler.codegen.kernel_backend import CompiledKernels, KernelBackend
from kiln.compiler.codegen.triton_exprs import PRELUDE
from kiln.compiler.codegen.triton_kernels import TritonKernelWriter, persistent
from kiln.compiler.codegen.triton_libm import interpreting

MODULE_HEADER = '''import triton
import triton.language as tl
from kiln.compiler.codegen.triton_libm import load as load_libm

libm = load_libm()
'''


def triton_installed():
    return importlib.util.find_spec("triton") is not None


class TritonBackend(KernelBackend):
    name = "triton"
    one_pass_variance = True  # a looped row is read once for its mean and variance, not twice

    def reaches(self, device):
        if not triton_installed():
            return False
        if device.type == "cuda":
            import torch
            return torch.cuda.is_available() and not interpreting()
        return device.type == "cpu" and interpreting()  # the interpreter runs kernels on host memory

    def plan_storage(self, program, kernels):
        """No shared workspace (each value its own tensor), and a row a looped kernel reads again
        in a later stage goes through memory (no per-thread arrays)."""
        for kernel in kernels:
            for node in kernel.nodes:
                storage = program.storage[node.name]
                if storage == "workspace" or (storage == "row" and not persistent(kernel)):
                    program.storage[node.name] = "tensor"

    def compile(self, program, memory, options, symbols, kernels):
        written = [TritonKernelWriter(kernel, program, symbols).write() for kernel in kernels]
        source = MODULE_HEADER + PRELUDE + "\n\n" + "\n\n".join(k.source for k in written)
        module = load_module(source)

        searches = [name for name, option in TUNING_SEARCHES if options.get(option)]
        tuner = autotuner(source, written, searches) if searches else None

        def emit_call(src, entry, float_names):
            launch(src, module, entry, tuner)
        return CompiledKernels(self.name, written, source, emit_call, module.__file__)


# (search, the option that turns it on), in the order they run (codegen/triton_autotune)
TUNING_SEARCHES = (("max_autotune", "max_autotune"), ("coordinate_descent", "coordinate_descent_tuning"))


def autotuner(source, written, searches):
    """(module, TritonKernel, Launch) -> the AutotunedLaunch the wrapper calls in its place
    (the `searches` of max_autotune, coordinate_descent_tuning). A choice is keyed by the kernel's
    own text (its functions' names left out: they count kernels in a graph), the helpers, the
    device and Triton's version."""
    import triton
    from kiln.compiler.build import cache_dir
    from kiln.compiler.codegen import triton_autotune
    device = "interpreter" if interpreting() else _cuda_device_name(written)
    common = f"{_digest(PRELUDE)}|{device}|triton {triton.__version__}"
    cache = triton_autotune.DiskCache(str(cache_dir() / "autotune"))

    def tuned(module, kernel, step):
        default = triton_autotune.Config(step.xblock, step.rblock, step.num_warps)
        text = re.sub(r"^def \w+\(", "def kernel(", kernel.source, flags=re.M)
        identity = f"{_digest(text)}|{common}|launch {kernel.launches.index(step)}"
        return triton_autotune.AutotunedLaunch(getattr(module, step.name), step.name, default, step.kind, identity,
                                               cache, triton_autotune.timer, searches)
    return tuned


def _digest(text):
    return hashlib.sha256(text.encode()).hexdigest()


def _cuda_device_name(written):
    import torch
    device = next((k.device for k in written if k.device is not None and k.device.type == "cuda"), None)
    return torch.cuda.get_device_name(device) if device is not None else "cpu"


def launch(src, module, entry, tuner=None):
    """The wrapper's lines launching a kernel's functions, each over cdiv(numel, XBLOCK) programs
    (with `tuner`, through an AutotunedLaunch that picks the blocks)."""
    from kiln.compiler.wrapper import pyexpr, raise_failed_check
    if entry.checks:  # a failed index check stores (code, -, bound) here
        device = src.constant(entry.device, "device")
        src.line(f"err = torch.zeros(3, dtype=torch.int64, device={device})")
    for step in entry.launches:
        numel, rnumel = sympy.sympify(step.numel), sympy.sympify(step.rnumel)
        if numel == 0:
            continue
        args = ["err"] * bool(entry.checks) + entry.args + entry.sizes + [pyexpr(numel), pyexpr(rnumel)]
        if tuner is not None:
            call = f"{src.constant(tuner(module, entry, step), 'tuned_')}({pyexpr(numel)}, {pyexpr(rnumel)}, {', '.join(args)})"
        else:
            grid = pyexpr(sympy.ceiling(numel / step.xblock)) if numel.is_number else \
                f"(({pyexpr(numel)}) + {step.xblock - 1}) // {step.xblock}"
            call = (f"{src.constant(getattr(module, step.name), 'triton_')}[({grid},)]({', '.join(args)}, "
                    f"XBLOCK={step.xblock}, RBLOCK={step.rblock}, num_warps={step.num_warps})")
        src.line(call if numel.is_number else f"if {pyexpr(numel)} > 0: {call}")
    if entry.checks:
        src.line("err = err.tolist()")
        raise_failed_check(src, entry.checks)


def load_module(source):
    """Write the kernels' module into the kiln cache (Triton reads a kernel's source from its file)
    and import it; one module per source text."""
    from kiln.compiler.build import cache_dir
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    name = f"kiln_triton_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    folder = cache_dir() / "triton"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".tmp{id(source)}")
        tmp.write_text(source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
