"""The one native helper library kiln builds against torch's own headers: the tensor guards' checker
(capture/tensor_checks) and the wrapper's entry calls (compiler/native_calls), in one translation
unit, so a process with a fresh cache runs g++ over torch's headers once, not once per helper. Here:
their C++, where a tensor's Python object keeps its TensorImpl, the flags that build against torch,
and `Helper`: the library loads at once where it is built, and is otherwise built in a thread, so
that no compile waits for g++ (what asks for a helper meanwhile takes its Python path)."""
import atexit
import ctypes
import os
import sysconfig
import threading

import torch

from kiln.debug.logs import log

ENTRY_CALL_MAX_ARGS = 64  # entries with more arguments keep ctypes (native_calls)

def impl_offset():
    """Where a tensor's Python object holds its TensorImpl pointer (THPVariable's `cdata`: right after
    the object header, or after MaybeOwned's flag in older torch), confirmed on several tensors; None
    where it is found at neither place."""
    probes = [torch.empty(2, 3), torch.nn.Parameter(torch.empty(3)), torch.empty(4, 5)[1:, ::2]]
    for offset in (16, 24):
        if all(ctypes.c_void_p.from_address(id(t) + offset).value == t._cdata for t in probes):
            return offset
    return None


def build_flags():
    """Compiler flags for a translation unit that includes torch's and Python's headers and links c10."""
    # torch's headers and libraries where its package keeps them (torch.utils.cpp_extension says the
    # same, but importing it brings setuptools: ~80 ms on a warm start that never builds)
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    includes = [f"-I{os.path.join(torch_dir, 'include')}", f"-I{sysconfig.get_paths()['include']}"]
    lib_dir = os.path.join(torch_dir, "lib")
    # (libraries come before the source in build's command line: --no-as-needed keeps c10 linked)
    return ("-w", *includes, f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-Wl,--no-as-needed", "-lc10")


# ---- the C++: each part in a namespace of its own, its entry point `extern "C"` ---------------------
_TENSOR_CHECKS = r"""
// kiln tensor guards

static Py_ssize_t impl_offset = -1;

static c10::TensorImpl* impl_of(PyObject* o) {
  return *reinterpret_cast<c10::TensorImpl**>(reinterpret_cast<char*>(o) + impl_offset);
}

static PyObject* int_tuple(c10::IntArrayRef values) {
  PyObject* t = PyTuple_New((Py_ssize_t)values.size());
  if (!t) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(values[i]));
  return t;
}

static bool same_ints(PyObject* expected, c10::IntArrayRef values) {
  Py_ssize_t n = PyTuple_GET_SIZE(expected);
  if (n != (Py_ssize_t)values.size()) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* e = PyTuple_GET_ITEM(expected, i);
    if (e == Py_None) continue;  // a dynamic dim: its size is checked by the shape guards
    if (PyLong_AsLongLong(e) != values[i]) return false;
  }
  return true;
}

// spec: (type, scalar type, device type, device index or None, requires_grad, sizes, strides or None,
//        contiguous or None); sizes hold None for dynamic dims
static bool matches(PyObject* o, PyObject* spec) {
  if ((PyObject*)Py_TYPE(o) != PyTuple_GET_ITEM(spec, 0)) return false;
  c10::TensorImpl* t = impl_of(o);
  if (t == nullptr || t->layout() != c10::kStrided) return false;
  if ((long)t->dtype().toScalarType() != PyLong_AsLong(PyTuple_GET_ITEM(spec, 1))) return false;
  c10::Device device = t->device();
  if ((long)device.type() != PyLong_AsLong(PyTuple_GET_ITEM(spec, 2))) return false;
  PyObject* index = PyTuple_GET_ITEM(spec, 3);  // None on CPU: `t.is_cpu` is the check there
  if (index != Py_None && (long)device.index() != PyLong_AsLong(index)) return false;
  if (t->requires_grad() != (PyTuple_GET_ITEM(spec, 4) == Py_True)) return false;
  if (!same_ints(PyTuple_GET_ITEM(spec, 5), t->sizes())) return false;
  PyObject* strides = PyTuple_GET_ITEM(spec, 6);
  if (strides != Py_None && !same_ints(strides, t->strides())) return false;
  PyObject* contiguous = PyTuple_GET_ITEM(spec, 7);
  if (contiguous != Py_None && t->is_contiguous() != (contiguous == Py_True)) return false;
  return true;
}

// check_all(tensors, specs) -> bool: every tensor matches its spec
static PyObject* check_all(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
      PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "check_all(tensors, specs): two tuples of one length");
    return nullptr;
  }
  try {
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(args[0]); i < n; ++i)
      if (!matches(PyTuple_GET_ITEM(args[0], i), PyTuple_GET_ITEM(args[1], i))) Py_RETURN_FALSE;
  } catch (...) {  // a getter that throws (symbolic sizes) fails the guard, as in Python
    Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

// facts(tensor) -> (scalar type, device type, device index, requires_grad, sizes, strides, contiguous)
static PyObject* facts(PyObject*, PyObject* o) {
  try {
    c10::TensorImpl* t = impl_of(o);
    if (t == nullptr || t->layout() != c10::kStrided) Py_RETURN_NONE;
    c10::Device device = t->device();
    return Py_BuildValue("(iiiNNNN)", (int)t->dtype().toScalarType(), (int)device.type(), (int)device.index(),
                         PyBool_FromLong(t->requires_grad()), int_tuple(t->sizes()), int_tuple(t->strides()),
                         PyBool_FromLong(t->is_contiguous()));
  } catch (...) {
    Py_RETURN_NONE;
  }
}

static PyMethodDef methods[] = {
  {"check_all", (PyCFunction)(void (*)(void))check_all, METH_FASTCALL, "every tensor matches its spec"},
  {"facts", facts, METH_O, "what check_all reads of a tensor"},
};

extern "C" PyObject* kiln_tensor_checks(Py_ssize_t offset, int which) {
  impl_offset = offset;
  PyObject* name = PyUnicode_FromString("kiln.capture.tensor_checks");
  PyObject* fn = PyCFunction_NewEx(&methods[which], nullptr, name);
  Py_XDECREF(name);
  return fn;
}
"""

_ENTRY_CALL_CASES = "\n".join(
    f"    case {n}: reinterpret_cast<void (*)({', '.join(['int64_t'] * n) or 'void'})>(fn)"
    f"({', '.join(f'w[{i}]' for i in range(n))}); break;" for n in range(ENTRY_CALL_MAX_ARGS + 1))

_ENTRY_CALLS = r"""
// kiln native entry calls

static Py_ssize_t impl_offset = -1;
static PyObject* plain_tensor = nullptr;     // torch.Tensor
static PyObject* plain_parameter = nullptr;  // torch.nn.Parameter
static PyObject* data_ptr_name = nullptr;
static const char* CAPSULE = "kiln.native_entry";

struct Entry { void* fn; Py_ssize_t nargs; };

static void entry_free(PyObject* capsule) { delete static_cast<Entry*>(PyCapsule_GetPointer(capsule, CAPSULE)); }

// one argument as the 64-bit word the entry takes; false with a Python error set
static bool word(PyObject* o, int64_t* out) {
  PyObject* type = (PyObject*)Py_TYPE(o);
  if (type == plain_tensor || type == plain_parameter) {  // what Tensor.data_ptr() returns
    c10::TensorImpl* t = *reinterpret_cast<c10::TensorImpl**>(reinterpret_cast<char*>(o) + impl_offset);
    *out = reinterpret_cast<int64_t>(t->mutable_data());
    return true;
  }
  if (o == Py_None) { *out = 0; return true; }
  PyObject* r = nullptr;
  if (PyLong_Check(o)) {
    Py_INCREF(o);
    r = o;
  } else {  // a tensor subclass: its own data_ptr(), as the Python wrapper called it
    r = PyObject_CallMethodNoArgs(o, data_ptr_name);
    if (r == nullptr) return false;
  }
  *out = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return !(*out == -1 && PyErr_Occurred());
}

static PyObject* call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Entry* e = static_cast<Entry*>(PyCapsule_GetPointer(self, CAPSULE));
  if (e == nullptr) return nullptr;
  if (nargs != e->nargs) {
    PyErr_Format(PyExc_TypeError, "kiln native entry takes %zd arguments (%zd given)", e->nargs, nargs);
    return nullptr;
  }
  int64_t w[MAX_ARGS + 1];
  try {
    for (Py_ssize_t i = 0; i < nargs; ++i)
      if (!word(args[i], &w[i])) return nullptr;
  } catch (const std::exception& ex) {  // data_ptr's own errors (no storage, not allocated)
    PyErr_SetString(PyExc_RuntimeError, ex.what());
    return nullptr;
  }
  void* fn = e->fn;
  Py_BEGIN_ALLOW_THREADS
  switch (nargs) {
CASES
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyMethodDef call_def = {"kiln_native_entry", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
                               "a compiled entry, called with tensors, ints and None"};

// make(address, nargs) -> the callable for the entry at `address` taking nargs arguments
static PyObject* make(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "make(address, nargs)");
    return nullptr;
  }
  void* fn = PyLong_AsVoidPtr(args[0]);
  Py_ssize_t n = PyLong_AsSsize_t(args[1]);
  if (PyErr_Occurred()) return nullptr;
  if (fn == nullptr || n < 0 || n > MAX_ARGS) {
    PyErr_SetString(PyExc_ValueError, "make: a NULL entry or too many arguments");
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(new Entry{fn, n}, CAPSULE, entry_free);
  if (capsule == nullptr) return nullptr;
  PyObject* f = PyCFunction_NewEx(&call_def, capsule, nullptr);
  Py_DECREF(capsule);
  return f;
}

static PyMethodDef make_def = {"make", (PyCFunction)(void (*)(void))make, METH_FASTCALL, "a native entry caller"};

extern "C" PyObject* kiln_native_calls(Py_ssize_t offset, PyObject* tensor_type, PyObject* parameter_type) {
  impl_offset = offset;
  Py_INCREF(tensor_type);
  Py_INCREF(parameter_type);
  plain_tensor = tensor_type;
  plain_parameter = parameter_type;
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  if (data_ptr_name == nullptr) return nullptr;
  return PyCFunction_NewEx(&make_def, nullptr, nullptr);
}
""".replace("MAX_ARGS", str(ENTRY_CALL_MAX_ARGS)).replace("CASES", _ENTRY_CALL_CASES)

SOURCE = ("// kiln native helpers, built against torch TORCH_VERSION\n"
          "#include <Python.h>\n#include <c10/core/TensorImpl.h>\n#include <cstdint>\n#include <exception>\n"
          f"namespace kiln_tensor_checks {{\n{_TENSOR_CHECKS}\n}}\n"
          f"namespace kiln_entry_calls {{\n{_ENTRY_CALLS}\n}}\n")


class _Library:
    """The helper library: loaded where built, else built in a thread (`get`: it, or None meanwhile
    or where it cannot be used here)."""

    def __init__(self):
        self._loaded = None    # (CDLL, impl offset) once loaded; () where it cannot be used
        self._building = None  # the thread building it
        self._lock = threading.Lock()

    def get(self, wait=False):
        """`wait`: wait for a build under way (tests)."""
        if self._loaded is None:
            with self._lock:
                if self._loaded is None and self._building is None:
                    self._loaded = self._load(build=False)
                    if self._loaded is None:
                        self._building = threading.Thread(target=self._build, name="kiln-native-helpers", daemon=True)
                        self._building.start()
                        atexit.register(self._let_build_finish)
        if wait and self._building is not None:
            self._building.join()
        return self._loaded or None

    def _let_build_finish(self, timeout=60):
        """At exit, before the interpreter's finalization: a daemon thread still loading the library
        (dlopen of code linked against libtorch) while the process tears libtorch down can abort it
        ("terminate called without an active exception", seen once in a short-lived process)."""
        if self._building is not None:
            self._building.join(timeout)

    def _build(self):
        found = self._load(build=True)
        self._loaded = () if found is None else found

    def _load(self, build):
        """(library, impl offset); None when it is not built yet (`build` False); () when it cannot be used."""
        try:
            offset = impl_offset()
            if offset is None:
                log("perf_hints", "native helpers unused: a tensor's TensorImpl pointer was not found")
                return ()
            from kiln.compiler import build as builder
            lib = builder.load_library(SOURCE.replace("TORCH_VERSION", torch.__version__), name_hint="torch_native",
                                       extra_flags=build_flags(), build=build)
            return None if lib is None else (lib, offset)
        except Exception as e:  # no compiler, a header that does not compile: the Python paths
            log("perf_hints", "native helpers unavailable (%s): tensor guards and entry calls stay Python", e)
            return ()


_LIBRARY = _Library()


class Helper:
    """One part of the library: `make(lib, offset)` returns what the part hands out. `get()`: that,
    or None while the library is being built or where it cannot be used here."""

    def __init__(self, name, make):
        self.name, self.make = name, make
        self._made = None
        self._lock = threading.Lock()

    def get(self, wait=False):
        if self._made is None:
            found = _LIBRARY.get(wait)
            if found is None:
                return None
            with self._lock:
                if self._made is None:
                    try:
                        self._made = self.make(*found)
                    except Exception as e:
                        log("perf_hints", "native helper %s unavailable (%s)", self.name, e)
                        self._made = ()
        return self._made or None
