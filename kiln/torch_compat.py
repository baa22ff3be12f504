"""What kiln reads from torch that changed between the torch versions it supports, in one place.

Tested: torch 2.13 (Python 3.11), 2.11 (Python 3.12) and 2.14.1 (Python 3.13). Each name below is the
current torch's, with the older spelling as the fallback.
"""
import contextlib
import functools
import inspect

import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch.amp import autocast_mode
from torch.fx.experimental import symbolic_shapes

# A concrete value for a (maybe symbolic) int, for estimates only (adds no guard): optimization_hint
# in torch 2.13+ (torch 2.11 has size_hint instead; 2.13 no longer does).
optimization_hint = getattr(symbolic_shapes, "optimization_hint", None) or symbolic_shapes.size_hint

# The autocast context that _enter_autocast (the graph's autocast node) enters: a plain subclass of
# torch.amp.autocast in torch 2.13+; torch 2.11 enters torch.amp.autocast itself.
UnmanagedAutocast = getattr(autocast_mode, "_UnmanagedAutocast", autocast_mode.autocast)

# Ops whose Python decomposition (run under the Python dispatcher for symbolic sizes) gives other
# shapes than eager's C++ kernel in this torch: their fake run always takes the C++ path. torch 2.11's
# `lstm_impl` (one_layer_lstm) returns h_n/c_n with an extra dim when the input requires grad.
WRONG_PYTHON_DECOMPOSITIONS = frozenset([torch.lstm, torch._VF.lstm] if torch.__version__ < (2, 13) else [])


def dispatcher_for(target, args, kwargs):
    """Where a fake run of op `target` dispatches (capture's, and training's trace of the graph
    capture made). With symbolic sizes among its arguments: the Python dispatcher, which runs ops'
    SymInt-aware Python decompositions as torch.compile does (C++ composites such as torch 2.11's
    matmul, or addcmul of broadcast operands, read concrete sizes and fail; F.pad's meta would pin
    the sizes). With static sizes: the C++ kernels eager itself runs, so the shapes are eager's
    (torch 2.11's Python LSTM decomposition gives h_n an extra dim that eager's C++ LSTM does not)."""
    if target in WRONG_PYTHON_DECOMPOSITIONS or not any_symbolic((args, kwargs)):
        return contextlib.nullcontext()
    return enable_python_dispatcher()


_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "normal", "multinomial", "uniform", "exponential", "poisson",
                 "cauchy", "geometric", "seed", "rrelu")


def draws_random(target):
    """Whether op `target` (a function, method name or OpOverload) may draw random numbers: an aten
    op by its tag, a torch-level function or method (which has none) by its name, a conservative
    test (F.normalize counts too)."""
    if isinstance(target, torch._ops.OpOverload):
        return torch.Tag.nondeterministic_seeded in target.tags
    name = (target if isinstance(target, str) else getattr(target, "__name__", repr(target))).lower()
    return any(word in name for word in _RANDOM_WORDS)


def any_symbolic(tree):
    """Whether a symbolic number, or a tensor with a symbolic size, is among the leaves of `tree`."""
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(leaf, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in leaf.shape):
            return True
    return False

# What a call of `SomeFunction.apply` calls, as a key for capture's handlers: torch before 2.14 defines
# autograd.Function.apply as a classmethod of a Python function (the key: that function); torch 2.14
# defines it in C, a classmethod descriptor (the key: the descriptor; `cls.apply` is a builtin method
# bound to cls).
_apply = inspect.getattr_static(torch.autograd.Function, "apply")
function_apply = _apply.__func__ if isinstance(_apply, classmethod) else _apply


@functools.cache
def function_apply_takes_keywords():
    """Does `SomeFunction.apply(x, k=v)` bind keyword arguments to the forward of a Function that has a
    setup_context (torch 2.13+), or pass them to C, which raises "apply() takes no keyword arguments"
    (torch 2.11)? Asked of torch itself, the first time capture meets keywords to apply."""
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass
    try:
        Probe.apply(x=torch.zeros(1))
        return True
    except TypeError:
        return False


def forget_item_value(fake):
    """`fake` without the value of its real tensor. torch 2.14's FakeTensorMode.from_tensor keeps a
    0-d CPU integer or float64 tensor's value (item_memo) when the mode has no ShapeEnv, so `item()`
    on the fake returns that number: capture would fold the first call's data into the graph as a
    constant (a stale answer on every later call). kiln's fakes stand for every tensor a guard
    admits, never for one tensor's data."""
    if getattr(fake, "item_memo", None) is not None:
        fake.item_memo = None
    return fake
