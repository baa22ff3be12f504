"""What kiln reads from torch that changed between the torch versions it supports, in one place.

Tested: torch 2.13 (Python 3.11), 2.11 (Python 3.12) and 2.14.1 (Python 3.13). Each name below is the
current torch's, with the older spelling as the fallback.
"""
import functools
import inspect

import torch
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
