"""Capture: run Python frames symbolically into torch.fx graphs with guards.

Placeholder until capture lands: `optimize` runs the model eagerly.
"""
from kiln.debug.logs import log


def optimize(model, backend, *, fullgraph=False, dynamic=None):
    """Return a callable that runs `model` (function or nn.Module) through capture + `backend`."""
    log("perf_hints", "capture not built yet: %r runs eagerly", model)
    return model


def reset():
    """Forget every compiled entry."""
