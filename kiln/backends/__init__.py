"""Backends: callables (gm: torch.fx.GraphModule, example_inputs) -> compiled callable."""
from kiln.backends.registry import list_backends, lookup_backend, register_backend  # noqa: F401
from kiln.backends import builtin  # noqa: F401  (registers eager, inductor, aot_eager, ...)
