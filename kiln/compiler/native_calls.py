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
parameters: how x86-64 and AArch64 pass pointers and int64 alike. The helper is part of the one
library torch_native builds once per cache directory; until it is built, wrappers call through ctypes.
"""
import ctypes
import weakref

import torch

from kiln.compiler import torch_native

MAX_ARGS = torch_native.ENTRY_CALL_MAX_ARGS  # entries with more arguments keep ctypes


def _make(lib, offset):
    init = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_ssize_t, ctypes.py_object, ctypes.py_object)(
        ("kiln_native_calls", lib))
    return init(offset, torch.Tensor, torch.nn.Parameter)


_HELPER = torch_native.Helper("native_calls", _make)  # (its C++ is torch_native's _ENTRY_CALLS)
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
