"""The tensor guards of an entry in one native call.

A tensor guard (GuardSet.tensor_match) checks a tensor's type, dtype, device, sizes, strides and
requires_grad. Written in Python that is six attribute reads and two tuple compares, ~0.5 us per
tensor: a model's parameters made tensor guards most of an entry's guard time. Here a small C++
helper reads the same facts straight from each tensor's TensorImpl and compares them with a `spec`
made at capture, for all of an entry's tensors in one call (~20 ns per tensor).

The helper reads exactly what Python's getters read (`t.shape` is the TensorImpl's sizes, custom
size policies included; `t.dtype` its scalar type; ...), so a spec passes exactly when the Python
check would. It is used only where that holds for sure:
- tensors whose type is exactly torch.Tensor or nn.Parameter (a subclass may override a getter in
  Python) and whose layout is strided (`stride()` raises for others; the helper fails them);
- when this torch's header compiles, and the offset of the TensorImpl pointer in a tensor's Python
  object is found and confirmed against `Tensor._cdata` (`_find_impl_offset`), and the facts the
  helper reads of the tensor at capture equal what Python reads of it (`spec`). Otherwise a guard
  stays a Python line.
The helper is built once per cache directory (build.load_library: keyed by this source, which names
the torch version its header came from), in a thread so that no compile waits for it (`_helper`);
`check_all` is this module's attribute, so a guard text stored on disk (capture_cache) finds it by
name (an entry stored with native checks is refused, and recompiled, where the helper is not loaded).
"""
import ctypes

import torch

from kiln.compiler import torch_native

# the exact types whose facts Python reads with torch's own getters (no Python override)
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)

_SOURCE = r"""
// kiln tensor guards, built against torch TORCH_VERSION
#include <Python.h>
#include <c10/core/TensorImpl.h>

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

def _make(lib, offset):
    make = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_ssize_t, ctypes.c_int)(("kiln_tensor_checks", lib))
    return make(offset, 0), make(offset, 1)


_HELPER = torch_native.Helper("tensor_checks", _SOURCE, _make)


def _helper(wait=False):
    """(check_all, facts), or () where the helper cannot be used here or is still being built.

    A helper already built (on disk) loads at once; one that is not is built in a thread (a second
    or so of g++), so a cold first compile does not wait for it: entries compiled meanwhile keep
    Python lines. `wait`: wait for that build (tests)."""
    return _HELPER.get(wait) or ()


def spec(t, dynamic=()):
    """The spec check_all compares `t`'s facts with (what GuardSet.tensor_match checks of it), or
    None where this tensor's guard stays a Python line."""
    helper = _helper()
    if type(t) not in PLAIN_TYPES or t.layout != torch.strided or not helper:
        return None
    found = helper[1](t)
    if found is None:
        return None
    scalar_type, device_type, device_index, requires_grad, sizes, strides, contiguous = found
    # the helper must read what Python reads (a wrong layout assumption would show here)
    if (sizes != tuple(t.shape) or strides != t.stride() or requires_grad != t.requires_grad or
            contiguous != t.is_contiguous() or (device_type == 0) != t.is_cpu):
        return None
    if device_type == 0:  # CPU: `v.is_cpu` (any index) is the Python check
        device_index = None
    if dynamic:
        return (type(t), scalar_type, device_type, device_index, requires_grad,
                tuple(None if d in dynamic else n for d, n in enumerate(sizes)), None, contiguous)
    return (type(t), scalar_type, device_type, device_index, requires_grad, sizes, strides, None)


def __getattr__(name):
    # `check_all` is looked up by name when a stored guard text is loaded (portable.rebuild)
    if name == "check_all" and _helper():
        return _helper()[0]
    raise AttributeError(name)
