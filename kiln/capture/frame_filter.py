"""Which callee frames are worth compiling: torch.compile's test, applied where kiln's runtime is
handed a Python function called natively (by the glue at a graph break, or by a frame that runs
eagerly).

A frame with no tensor among its arguments and closure cells and no torch module among the globals
its code names computes nothing a graph could hold, so it runs natively, as torch.compile's frame
hook leaves it. That also keeps its meaning: a helper like Hugging Face's `is_torchdynamo_compiling()`
(it imports torch locally) answers False when it runs natively, as in eager, where a compiled copy
would answer True to code that is itself running eagerly, which then takes the path meant for
compilation (LongT5 left its attention mask None and raised).
"""
import types
import weakref

import torch

try:
    import numpy as np
    _NUMPY_TYPES = (np.ndarray, np.generic)
except ImportError:  # pragma: no cover
    np, _NUMPY_TYPES = None, ()


def worth_compiling(fn, args, kwargs):
    """Whether calling `fn` (a Python function) with these arguments could run torch code."""
    seen = set()
    if any(_holds_tensor(v, seen) for v in args) or any(_holds_tensor(v, seen) for v in kwargs.values()):
        return True
    for cell in fn.__closure__ or ():
        try:
            if _holds_tensor(cell.cell_contents, seen):
                return True
        except ValueError:  # an empty cell
            pass
    return _names_torch(fn)


_NAMES_TORCH = weakref.WeakKeyDictionary()  # code -> (id of its globals, whether they name torch there)


def _names_torch(fn):
    """A global the code names is torch, one of its modules, or numpy (which kiln traces through torch).
    Found once per code object and globals (it is asked on every call a skipped frame makes); a module
    that binds torch after that keeps the first answer, which decides only whether the callee compiles."""
    g, code = fn.__globals__, fn.__code__
    known = _NAMES_TORCH.get(code)
    if known is not None and known[0] == id(g):
        return known[1]
    found = any(_is_torch_module(g.get(name)) for name in code.co_names)
    _NAMES_TORCH[code] = (id(g), found)
    return found


def _is_torch_module(obj):
    return isinstance(obj, types.ModuleType) and (obj is torch or obj.__name__.startswith("torch.") or obj is np)


def _holds_tensor(v, seen):
    """v is a tensor, a module or module class, a NumPy value, or an exact list, tuple, dict or
    namedtuple holding one (other objects are not looked into, as torch.compile does not)."""
    if id(v) in seen:
        return False
    seen.add(id(v))
    if isinstance(v, (torch.Tensor, torch.nn.Module) + _NUMPY_TYPES):
        return True
    t = type(v)
    if t is type:
        return issubclass(v, torch.nn.Module)
    if t in (list, tuple):
        return any(_holds_tensor(x, seen) for x in v)
    if t is dict:
        return any(_holds_tensor(x, seen) for x in v.values())
    if isinstance(v, tuple) and hasattr(t, "_fields"):
        return any(_holds_tensor(x, seen) for x in v)
    return False
