"""Capture: run Python frames symbolically into torch.fx graphs with guards (see DESIGN.md).

`optimize(model, backend)` returns the compiled callable; `reset()` forgets every cache entry.
Modules: runtime (caches, hot path), convert (one frame -> entry), interpreter + objects +
python_builtins (symbolic execution), variables, sources, guards, graph_builder, side_effects,
glue, resume; autograd_function (Function.apply traced; subgraphs closes its graphs); dynamic (which dims are symbolic: marks, dynamic=, automatic dynamic) and shape_watch
(which user line made each shape guard; errors for marked dims forced static).
"""
import sys
import types

import torch

# Only the runtime is imported with kiln: the interpreter, fake tensors, sympy and the compiler load on
# the first compile (convert imports them), so `import kiln` costs little over `import torch`.
from kiln.capture import callees, eager_frames, runtime  # noqa: F401 (eager_frames installs itself)


def optimize(model, backend, *, fullgraph=False, dynamic=None):
    """Return a callable that runs `model` (function or nn.Module) through capture + `backend`.

    `dynamic`: None specializes sizes first and makes a dimension symbolic once it changes; True
    makes every dimension of every input symbolic; False always specializes.
    """
    if isinstance(model, types.FunctionType):
        return runtime.optimize_function(model, backend, fullgraph, dynamic)
    if isinstance(model, types.MethodType) and isinstance(model.__func__, types.FunctionType) and \
            not isinstance(model.__self__, torch.nn.Module):
        compiled = runtime.optimize_function(model.__func__, backend, fullgraph, dynamic)
        owner = model.__self__
        return lambda *args, **kwargs: compiled(owner, *args, **kwargs)
    # modules (and other callables) compile a small caller frame, so hooks and __call__ are honoured
    return runtime.optimize_function(callees.synthetic_caller(model), backend, fullgraph, dynamic)


def reset():
    """Forget every compiled entry."""
    runtime.reset()
    resume = sys.modules.get("kiln.capture.resume")  # loaded with the first compile, if any
    if resume is not None:
        resume.reset()
