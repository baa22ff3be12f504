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


def fake_runs_python_dispatcher(target):
    """Should capture run `target` on fake tensors under the Python dispatcher (its SymInt-aware Python
    decompositions)? Yes, except torch.lstm on a torch whose Python decomposition of it is wrong."""
    return not (target == torch.lstm and _lstm_decomposition_is_wrong())


@functools.cache
def _lstm_decomposition_is_wrong():
    """torch 2.11's Python decomposition of torch.lstm (CPU, an input needing grad, batch > 1) gives h_n
    and c_n an extra dimension: (layers, 1, batch, hidden). The real op does not, so the shapes capture
    read from the fakes would be wrong answers. Asked of torch itself, the first time capture meets lstm."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(), torch.enable_grad():
        x, h = torch.empty(2, 1, 1, requires_grad=True), torch.empty(1, 2, 1)
        weights = [torch.empty(4, 1, requires_grad=True) for _ in range(2)] + \
            [torch.empty(4, requires_grad=True) for _ in range(2)]
        with enable_python_dispatcher():
            h_n = torch.lstm(x, (h, h), weights, True, 1, 0.0, True, False, True)[1]
    return h_n.shape != h.shape
