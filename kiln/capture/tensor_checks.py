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
  object is found and confirmed against `Tensor._cdata` (torch_native.impl_offset), and the facts the
  helper reads of the tensor at capture equal what Python reads of it (`spec`). Otherwise a guard
  stays a Python line.
The helper is a part of the one library torch_native builds once per cache directory (keyed by its
source, which names the torch version its header came from), in a thread so that no compile waits
for it (`_helper`);
`check_all` is this module's attribute, so a guard text stored on disk (capture_cache) finds it by
name (an entry stored with native checks is refused, and recompiled, where the helper is not loaded).
"""
import ctypes

import torch

# the exact types whose facts Python reads with torch's own getters (no Python override)
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _make(lib, offset):
    make = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_ssize_t, ctypes.c_int)(("kiln_tensor_checks", lib))
    return make(offset, 0), make(offset, 1)


_HELPER = None  # torch_native.Helper, made on first use (`import kiln` loads no kiln.compiler)


def _helper(wait=False):
    """(check_all, facts), or () where the helper cannot be used here or is still being built.

    A helper already built (on disk) loads at once; one that is not is built in a thread (a second
    or so of g++), so a cold first compile does not wait for it: entries compiled meanwhile keep
    Python lines. `wait`: wait for that build (tests)."""
    global _HELPER
    if _HELPER is None:
        from kiln.compiler import torch_native  # (its C++ is torch_native's _TENSOR_CHECKS)
        _HELPER = torch_native.Helper("tensor_checks", _make)
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
