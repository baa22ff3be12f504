"""The program's saved-tensor hooks, hidden while kiln compiles.

Capture and the backend run ops only to trace them. The program's saved-tensor hooks
(torch.autograd.graph.saved_tensors_hooks) are for its own ops, not these: a pair of no-op hooks on
top of the stack hides them while compiling. torch.func's grad transforms refuse to run under any
saved-tensor hooks, so a traced transform lifts kiln's pair for its own run (`exposed`).
"""
import contextlib

import torch

_autograd = torch._C._autograd


def _unchanged(t):
    return t


@contextlib.contextmanager
def hidden():
    if not _autograd._saved_tensors_hooks_is_enabled():  # (a transform disabled them)
        yield
        return
    _autograd._push_saved_tensors_default_hooks(_unchanged, _unchanged)
    try:
        yield
    finally:
        _autograd._pop_saved_tensors_default_hooks()


@contextlib.contextmanager
def exposed():
    """Within `hidden()`: kiln's pair taken off the top for the block, put back after."""
    top = _autograd._top_saved_tensors_default_hooks(True)
    if top is None or top[0] is not _unchanged:
        yield
        return
    _autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        _autograd._push_saved_tensors_default_hooks(_unchanged, _unchanged)
