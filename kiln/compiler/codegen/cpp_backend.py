"""The C++/OpenMP kernel backend: kernels on CPU memory, one translation unit per graph (codegen/cpp),
built and loaded with ctypes (build.py), each entry called from the wrapper with its tensors
(native_calls) or their data pointers (ctypes)."""
import ctypes

from kiln.compiler import native_calls
from kiln.compiler.codegen.kernel_backend import CompiledKernels, KernelBackend


class CppBackend(KernelBackend):
    name = "cpp"

    def reaches(self, device):
        return device.type == "cpu"  # raw pointers into host memory: nothing else

    def compile(self, program, memory, options, symbols, kernels):
        from kiln.compiler.build import load_library
        from kiln.compiler.codegen import cpp
        from kiln.debug import report
        source, entries = cpp.generate(program, memory, options, symbols, kernels)
        with report.stage("build"):
            lib = load_library(source, name_hint="graph", extra_flags=cpp.LINK_FLAGS) if entries else None

        def emit_call(src, entry, float_names):
            _emit_call(src, lib, entry, float_names)
        return CompiledKernels(self.name, entries, source, emit_call, getattr(lib, "_name", None))


def _emit_call(src, lib, entry, float_names):
    """One call of a native entry: its tensors, the workspace, size symbols, the error slot. Through a
    native caller (native_calls: it reads the tensors' data pointers itself) where the helper is
    loaded and no size is a float, else through ctypes with each tensor's data_ptr()."""
    from kiln.compiler.wrapper import raise_failed_check
    fn = getattr(lib, entry.name)
    if entry.packed:
        return _emit_packed_call(src, fn, entry, float_names)
    fn.argtypes = ([ctypes.c_void_p] * (len(entry.args) + entry.uses_workspace)
                   + [ctypes.c_double if name in float_names else ctypes.c_int64 for name in entry.sizes]
                   + [ctypes.c_void_p] * bool(entry.checks))
    fn.restype = None
    native = None if any(name in float_names for name in entry.sizes) else native_calls.caller(fn, len(fn.argtypes))
    tensors = list(entry.args) if native is not None else [f"{a}.data_ptr()" for a in entry.args]
    call_args = tensors + (["ws_ptr"] if entry.uses_workspace else []) + list(entry.sizes)
    if entry.checks:  # a failed check in the kernels reports (code, index, bound) here
        call_args.append(_error_slot(src))
    src.line(f"{src.constant(fn if native is None else native, 'entry')}({', '.join(call_args)})")
    if entry.checks:
        raise_failed_check(src, entry.checks, "cpu_err")


def _emit_packed_call(src, fn, entry, float_names):
    """A call of an entry that takes its arguments as one array of 64-bit words (cpp.PACK_ABOVE):
    the wrapper fills the array (a float size as its bits) and passes its address."""
    from kiln.compiler.wrapper import raise_failed_check
    fn.argtypes, fn.restype = [ctypes.c_void_p], None
    bits = src.constant(_float_bits, "float_bits") if any(n in float_names for n in entry.sizes) else None
    words = [f"{a}.data_ptr()" for a in entry.args] + (["(ws_ptr or 0)"] if entry.uses_workspace else [])
    words += [f"{bits}({name})" if name in float_names else name for name in entry.sizes]
    words += [_error_slot(src)] if entry.checks else []
    array = src.constant(ctypes.c_int64 * len(words), "packed")
    src.line(f"packed_args = {array}({', '.join(words)})")
    src.line(f"{src.constant(fn, 'entry')}(ctypes.addressof(packed_args))")
    if entry.checks:
        raise_failed_check(src, entry.checks, "cpu_err")


def _float_bits(x):
    """The 64-bit word holding the bits of double x."""
    return ctypes.c_int64.from_buffer(ctypes.c_double(x)).value


def _error_slot(src):
    """The address of the call's error slot, made at its first use: one per call, which a kernel
    writes only to raise (a failed check's code, index and bound)."""
    if not getattr(src, "cpu_err_made", False):
        src.cpu_err_made = True
        src.line("cpu_err = (ctypes.c_int64 * 3)()")
        src.line("cpu_err_ptr = ctypes.addressof(cpu_err)")
    return "cpu_err_ptr"
