"""NumPy traced through torch, as torch.compile does it: an ndarray in the frame is a tensor in the
graph, and NumPy's functions, methods and operators on it become graph nodes that run torch's NumPy
layer (torch._numpy) on those tensors, so NumPy's semantics (dtypes, promotion, 0-d results as
scalars) hold. ndarray arguments enter the graph through torch.from_numpy (sharing their memory, so
in-place writes reach them); ndarray results leave it as `tensor.numpy()`.

What falls outside (np.random, object arrays, a function torch._numpy lacks, reading an array's
values in Python) breaks the graph cleanly. NumPy calls on constants only (np.sqrt(2.0), np.dtype)
run natively at capture time.
"""
import importlib.util
import operator
import sys

import torch

from kiln.capture import graph_builder, objects
from kiln.capture.objects import TypeModel, const_value, describe
from kiln.capture.python_builtins import BUILTIN_HANDLERS
from kiln.capture.sources import ConvertedSource
from kiln.capture.variables import (ConstantVariable, ListVariable, MethodVariable, NDArrayVariable, ObjectVariable,
                                    TensorVariable, TupleVariable, const)
from kiln.exc import Unsupported

_OPERATORS = {f"operator.{op.__name__}": op for op in
              (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
               operator.pow, operator.matmul, operator.and_, operator.or_, operator.xor, operator.lshift,
               operator.rshift, operator.neg, operator.pos, operator.invert, operator.abs, operator.lt,
               operator.le, operator.eq, operator.ne, operator.gt, operator.ge, operator.getitem,
               operator.iadd, operator.isub, operator.imul, operator.itruediv)}
# functions whose 0-d result NumPy keeps as an array (the others hand out a scalar)
_MAKES_ARRAYS = {"array", "asarray", "ascontiguousarray", "copy", "zeros", "ones", "empty", "full", "zeros_like",
                 "ones_like", "empty_like", "full_like", "atleast_1d", "atleast_2d", "atleast_3d", "reshape",
                 "operator.getitem", "copy"}


# ---- what the graph nodes run (on tensors standing for ndarrays) --------------------------------------
def _tnp():
    import torch._numpy as tnp
    return tnp


def _resolve(path):
    if path in _OPERATORS:
        return _OPERATORS[path]
    target = _tnp()
    for part in path.split("."):
        target = getattr(target, part)
    return target


def _to_tnp(x):
    if isinstance(x, torch.Tensor):
        return _tnp().ndarray(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_tnp(i) for i in x)
    return x


def _to_torch(x):
    tnp = _tnp()
    if isinstance(x, tnp.ndarray):
        return x.tensor
    if isinstance(x, (list, tuple)):
        return type(x)(_to_torch(i) for i in x)
    if isinstance(x, tnp.generic):
        return x.tensor if hasattr(x, "tensor") else torch.as_tensor(x.item())
    return x


def numpy_call(path, *args, **kwargs):
    """`path(*args, **kwargs)` in torch._numpy (a function, "linalg.norm", or "operator.add")."""
    return _to_torch(_resolve(path)(*_to_tnp(args), **{k: _to_tnp(v) for k, v in kwargs.items()}))


def numpy_method(name, array, *args, **kwargs):
    return _to_torch(getattr(_tnp().ndarray(array), name)(*_to_tnp(args), **{k: _to_tnp(v) for k, v in kwargs.items()}))


def numpy_attribute(name, array):
    return _to_torch(getattr(_tnp().ndarray(array), name))


def numpy_setitem(array, index, value):
    _tnp().ndarray(array)[_to_tnp(index)] = _to_tnp(value)


# ---- capture ------------------------------------------------------------------------------------------
def _graph_arg(v):
    """An argument of a NumPy node: an ndarray's tensor, a dtype as its name, containers recursively."""
    if isinstance(v, NDArrayVariable):
        return v.tensor
    if isinstance(v, (ListVariable, TupleVariable)):
        items = [_graph_arg(i) for i in v.items]
        return ListVariable(items) if isinstance(v, ListVariable) else TupleVariable(items)
    if isinstance(v, (ConstantVariable, ObjectVariable)) and _is_dtype_like(v.value):
        return const(_np().dtype(v.value).name)
    return v


def _np():
    return sys.modules["numpy"]


def _is_dtype_like(value):
    np = _np()
    return isinstance(value, np.dtype) or isinstance(value, type) and issubclass(value, np.generic)


def _result(og, node_fn, path, args, kwargs, scalar_ok=True):
    """Record a NumPy node; its tensor results become ndarrays (a 0-d one a scalar, as NumPy does)."""
    result = og.call_op("call_function", node_fn, [const(path)] + [_graph_arg(a) for a in args],
                        {k: _graph_arg(v) for k, v in kwargs.items()})
    return _as_arrays(result, scalar_ok and path not in _MAKES_ARRAYS)


def _as_arrays(v, scalar_ok):
    if isinstance(v, TensorVariable):
        return NDArrayVariable(v, scalar=scalar_ok and v.fake.dim() == 0)
    if isinstance(v, (TupleVariable, ListVariable)):
        items = [_as_arrays(i, scalar_ok) for i in v.items]
        return TupleVariable(items, cls=v.cls) if isinstance(v, TupleVariable) else ListVariable(items)
    return v


def _holds_array(v):
    if isinstance(v, (NDArrayVariable, TensorVariable)):
        return True
    if isinstance(v, (ListVariable, TupleVariable)):
        return any(_holds_array(i) for i in v.items)
    return False


def _fold(og, fn, args, kwargs):
    values = [const_value(a, "a NumPy argument") for a in args]
    kw = {k: const_value(v, "a NumPy argument") for k, v in kwargs.items()}
    try:
        result = fn(*values, **kw)
    except Exception as e:
        raise Unsupported(f"numpy {getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}",
                          python_exception=e) from e
    if isinstance(result, _np().ndarray):
        raise Unsupported("a NumPy array made from constants at capture time")  # (an np.array factory below)
    return objects.result_var(og, result)


class NumpyModuleModel(TypeModel):
    """A callable of the numpy package (np.sum, np.exp, np.linalg.norm, np.dtype, np.float32)."""

    def call(self, frame, var, args, kwargs):
        fn = var.value
        np = _np()
        if isinstance(fn, type) or fn in (np.dtype,):  # dtypes, scalar types, finfo/iinfo: pure on constants
            if any(_holds_array(a) for a in list(args) + list(kwargs.values())):
                raise Unsupported(f"numpy {fn.__name__} of an array")
            return _fold(frame.og, fn, args, kwargs)
        path = _tnp_path(fn)
        if path is None:
            raise Unsupported(f"numpy.{getattr(fn, '__name__', fn)} is not traced through torch")
        if not any(_holds_array(a) for a in list(args) + list(kwargs.values())) and \
                path.rsplit(".", 1)[-1] not in _MAKES_ARRAYS and path not in ("arange", "linspace", "eye",
                                                                             "identity", "logspace"):
            return _fold(frame.og, fn, args, kwargs)
        return _result(frame.og, numpy_call, path, [_as_array_arg(a) for a in args],
                       {k: _as_array_arg(v) for k, v in kwargs.items()})


def _as_array_arg(v):
    """A torch tensor handed to a NumPy function is an ndarray to it (np.mean(t) converts t)."""
    return NDArrayVariable(v) if isinstance(v, TensorVariable) else v


def _tnp_path(fn):
    """Where `fn` of numpy lives in torch._numpy ("sum", "linalg.norm"), or None."""
    name = getattr(fn, "__name__", None)
    module = getattr(fn, "__module__", "") or ""
    sub = module.split(".")[1] if module.count(".") else ""
    path = f"{sub}.{name}" if sub in ("linalg", "fft", "random") else name
    if sub == "random":
        return None  # NumPy's random stream is not torch's: the same seed would give other numbers
    try:
        _resolve(path)
    except AttributeError:
        return None
    return path


class NDArrayModel(TypeModel):
    protocols = True
    _METADATA = {"shape", "ndim", "size", "dtype", "itemsize", "nbytes", "strides"}

    def attribute(self, frame, arr, name):
        fake = arr.tensor.fake
        if name in ("shape", "ndim", "size"):
            value = {"shape": tuple(fake.shape), "ndim": fake.dim(), "size": fake.numel()}[name]
            return objects.result_var(frame.og, value)
        if name in ("dtype", "itemsize", "nbytes"):
            dtype = _np().dtype(str(fake.dtype).replace("torch.", ""))
            return objects.result_var(frame.og, {"dtype": dtype, "itemsize": dtype.itemsize,
                                                 "nbytes": dtype.itemsize * fake.numel()}[name])
        if name == "__class__":
            return frame.og.wrap(_np().ndarray, None, guard=False)
        if name in ("T", "real", "imag", "flat", "mT"):
            return _result(frame.og, numpy_attribute, name, [arr], {}, scalar_ok=False)
        if not callable(getattr(_np().ndarray, name, None)):
            raise Unsupported(f"AttributeError: ndarray has no attribute {name!r}", python_exception=AttributeError(name))
        return MethodVariable(name, arr)

    def call_method(self, frame, arr, name, args, kwargs):
        if name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "tobytes", "__array__"):
            raise Unsupported(f"ndarray.{name}() needs the array's data in Python")
        if name == "__len__":
            if arr.tensor.fake.dim() == 0:
                raise Unsupported("len() of a 0-d array", python_exception=TypeError("len() of unsized object"))
            return const(arr.tensor.fake.shape[0])
        if name == "__iter__":
            return objects.get_iter(frame, TupleVariable([objects.getitem(frame, arr, const(i))
                                                          for i in range(self.call_method(frame, arr, "__len__", [], {}).value)]))
        if name == "__getitem__":
            return _result(frame.og, numpy_call, "operator.getitem", [arr, args[0]], {}, scalar_ok=True)
        if name == "__setitem__":
            frame.og.call_op("call_function", numpy_setitem, [arr.tensor, _graph_arg(args[0]), _graph_arg(args[1])], {})
            return const(None)
        if name == "__contains__":
            raise Unsupported("`in` over an array's values")
        return _result(frame.og, numpy_method, name, [arr] + list(args), kwargs, scalar_ok=name not in ("copy", "reshape"))

    def truth(self, frame, arr):
        raise Unsupported("the truth of an array needs its data in Python")

    def operator(self, frame, op, args):
        if any(isinstance(a, TensorVariable) for a in args):
            return None  # an ndarray with a torch tensor: left to the tensor's rules (eager mixes them so)
        path = f"operator.{op.__name__}"
        if path not in _OPERATORS:
            return None
        return _result(frame.og, numpy_call, path, list(args), {})


def wrap_ndarray(og, value, source, guard):
    """An ndarray from outside: its data enters the graph as torch.from_numpy(value)."""
    if source is None:
        raise Unsupported("an ndarray with no known origin")
    if value.dtype.hasobject or not value.dtype.isnative:
        raise Unsupported(f"an ndarray of dtype {value.dtype}")
    tensor = og.wrap(torch.from_numpy(value), ConvertedSource(torch.from_numpy, source))
    if guard:
        og.guards.type_match(source, value)
    return NDArrayVariable(tensor, source=source)


def tensor_numpy(frame, t, args, kwargs):
    """`t.numpy()`: the same data, as an ndarray."""
    if t.fake.requires_grad and not kwargs.get("force"):
        raise Unsupported("Tensor.numpy() of a tensor that requires grad",
                          python_exception=RuntimeError("Can't call numpy() on Tensor that requires grad."))
    return NDArrayVariable(t)


def _from_numpy(frame, args, kwargs):
    arr = args[0]
    if not isinstance(arr, NDArrayVariable):
        raise Unsupported(f"torch.from_numpy of {describe(arr)}")
    return arr.tensor


def _as_tensor(fn, copy):
    """torch.as_tensor / asarray / tensor of an ndarray: its tensor (copied for torch.tensor); other
    arguments follow torch's own rules."""
    def handler(frame, args, kwargs):
        if not args or not isinstance(args[0], NDArrayVariable):
            return objects.call_torch(frame, fn, args, kwargs)
        t = args[0].tensor
        if copy:
            t = frame.og.call_op("call_method", "clone", [t], {})
        if "dtype" in kwargs or "device" in kwargs:
            t = frame.og.call_op("call_method", "to", [t], {k: v for k, v in kwargs.items() if k in ("dtype", "device")})
        return t
    return handler


def _register():
    objects.VARIABLE_MODELS[NDArrayVariable] = NDArrayModel()
    objects.MODULE_MODELS["numpy"] = NumpyModuleModel()
    objects.TENSOR_METHODS["numpy"] = tensor_numpy
    graph_builder.VALUE_WRAPPERS[_np().ndarray] = wrap_ndarray
    BUILTIN_HANDLERS[torch.from_numpy] = _from_numpy
    for fn, copy in ((torch.as_tensor, False), (torch.asarray, False), (torch.tensor, True)):
        BUILTIN_HANDLERS[fn] = _as_tensor(fn, copy)


if importlib.util.find_spec("numpy") is not None:  # (torch itself imports numpy when it is installed)
    import numpy  # noqa: F401
    _register()
