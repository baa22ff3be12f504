"""The math functions Triton's core lacks (tanh, log1p, pow, ...), as generated kernels call them:
`libm.NAME(x)`. On a GPU they are libdevice's; under Triton's interpreter (TRITON_INTERPRET=1), which
runs kernels on NumPy arrays and has no libdevice, they are NumPy's, applied to the arrays the
interpreter's tensors hold."""
import math
import os
import types

import numpy as np

def _lgamma(x):
    try:
        return math.lgamma(x)
    except ValueError:  # a pole (0, -1, ...; masked-off lanes read 0): libdevice gives inf
        return math.inf


# name -> NumPy function of the same meaning (the libdevice function has the same name)
NUMPY_FUNCTIONS = {
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "log10": np.log10,
    "log1p": np.log1p, "expm1": np.expm1, "erfc": None, "lgamma": np.vectorize(_lgamma, otypes=[float]),
    "nearbyint": np.rint, "trunc": np.trunc, "atan2": np.arctan2, "pow": np.power, "fmod": np.fmod,
}
NUMPY_FUNCTIONS["erfc"] = np.vectorize(math.erfc, otypes=[float])


def interpreting():
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def _on_arrays(fn):
    """`fn` over the NumPy arrays of interpreter tensors, the result in the first argument's dtype and
    the arguments' broadcast shape (as libdevice's functions broadcast: `fmod(2.5, x)`)."""
    def call(*args, **_):
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle
        first = args[0]
        data = np.asarray(fn(*(a.handle.data for a in args))).astype(first.handle.data.dtype)
        scalar = first.type.scalar
        blocks = any(a.type.is_block() for a in args)
        return tl.core.tensor(TensorHandle(data, first.handle.dtype.scalar),
                              tl.core.block_type(scalar, [int(d) for d in data.shape]) if blocks else scalar)
    return call


def load():
    """libdevice, or under the interpreter the NumPy stand-ins (read when a kernel module loads)."""
    if interpreting():
        return types.SimpleNamespace(**{name: _on_arrays(fn) for name, fn in NUMPY_FUNCTIONS.items()})
    from triton.language.extra import libdevice
    return libdevice
