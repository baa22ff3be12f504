"""Calling a compiled C++ entry from the wrapper without ctypes.

Through ctypes, a call `entry(a.data_ptr(), b.data_ptr(), ws_ptr, s0, err_ptr)` costs ~0.5 us of
argument conversion plus ~50 ns per `data_ptr()` call: 0.7-1 us per entry, and a small transformer's
graph calls two dozen entries per call. `caller(fn, nargs)` makes a native callable that takes the
tensors themselves: it reads each tensor's data pointer from its TensorImpl (what `data_ptr()`
returns), takes ints (sizes, the workspace and error pointers) and None (a NULL workspace) as they
are, and calls the entry with the GIL released, as ctypes does. ~0.1 us per call.

It reads a TensorImpl only for tensors whose type is exactly torch.Tensor or nn.Parameter; anything
else (a subclass, which may answer `data_ptr` in Python) gets its `data_ptr()` called, as the
wrapper did. Every argument of an entry is a pointer or an int64 (an entry with a float size symbol
keeps ctypes), so the entry is called through a function type of that many 64-bit integer
parameters: how x86-64 and AArch64 pass pointers and int64 alike. The helper is built once per cache
directory (torch_native.Helper); until it is, wrappers call through ctypes.
"""
import ctypes
import weakref

import torch

from kiln.compiler import torch_native

MAX_ARGS = 64  # entries with more arguments keep ctypes

_CASES = "\n".join(
    f"    case {n}: reinterpret_cast<void (*)({', '.join(['int64_t'] * n) or 'void'})>(fn)"
    f"({', '.join(f'w[{i}]' for i in range(n))}); break;" for n in range(MAX_ARGS + 1))

_SOURCE = r"""
// kiln native entry calls, built against torch TORCH_VERSION
#include <Python.h>
#include <c10/core/TensorImpl.h>
#include <cstdint>
#include <exception>

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
""".replace("MAX_ARGS", str(MAX_ARGS)).replace("CASES", _CASES)


def _make(lib, offset):
    init = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_ssize_t, ctypes.py_object, ctypes.py_object)(
        ("kiln_native_calls", lib))
    return init(offset, torch.Tensor, torch.nn.Parameter)


_HELPER = torch_native.Helper("native_calls", _SOURCE, _make)
_ENTRIES = weakref.WeakKeyDictionary()  # caller -> the ctypes function it calls (graph_cache describes that)


def caller(fn, nargs, wait=False):
    """A native callable for ctypes function `fn` (an entry taking `nargs` pointer/int64 arguments),
    or None while the helper is not built, where it cannot be used, or for too many arguments."""
    make = _HELPER.get(wait)
    if make is None or nargs > MAX_ARGS:
        return None
    found = make(ctypes.cast(fn, ctypes.c_void_p).value, nargs)
    _ENTRIES[found] = fn
    return found


def entry_of(value):
    """The ctypes function a caller made here calls, or None for anything else."""
    try:
        return _ENTRIES.get(value)
    except TypeError:  # (not weakly referenceable: not a caller)
        return None
