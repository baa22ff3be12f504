"""A graph that raises when it runs: the frame runs again, eagerly, from its start.

The glue writes a frame's side effects back after its graph ran (glue.replay_side_effects), so a
graph that raises (an error its fake run did not see: a dtype mismatch in a matmul, an index
out of range) would leave undone the writes eager makes before the failing
op: `OBJ.n = x.shape[0]; y = x.double() @ w` raises in eager after setting OBJ.n. torch.compile
loses those writes too. When running the frame a second time cannot be told from running it once,
the glue instead runs the frame eagerly from its start, and eager's own error, traceback and side
effects are the answer. That holds when the graph wrote no tensor that outlives it (an input, a
parameter or buffer: it may have written some before it raised), drew no random numbers (a second
draw would differ), called no module as a whole (what it does inside is not known here) and entered
no profiler block; and when the frame is a plain function's (a generator's call returns a new
generator). A graph that autograd's backward runs (checkpoint recomputation) is never run again.
"""
import inspect

import torch

from kiln.debug.logs import log

# a check the graph runs on a number read out of tensor data (an `assert` or torch._check in the
# frame) raises RuntimeError, as torch.compile's graph does, where eager's `assert` raises
# AssertionError: kiln keeps torch.compile's RuntimeError there (tests of its own and Dynamo's expect it)
_CHECKS = (torch.ops.aten._assert_scalar.default,)
_NOT_PLAIN = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def can_rerun(og, code):
    """Whether the frame of `code`, whose graph `og` built, may run again eagerly after its graph
    raised (see the module docstring)."""
    from kiln.torch_compat import draws_random  # (capture time only: the glue's module loads no sympy)
    if code.co_flags & _NOT_PLAIN or og.native_enters or og.native_exits:
        return False
    for node in og.graph.nodes:
        if node.op == "call_module" or node.meta.get("kiln_writes_tensor") or node.target in _CHECKS:
            return False
        if node.op in ("call_function", "call_method") and draws_random(node.target):
            return False
    return True


def rerun_eagerly(F, L, error):
    """Run function F eagerly on the arguments bound in L (in co_varnames order), after its graph
    raised `error`. Not inside autograd's backward (activation checkpointing runs the forward again
    there, and stops it with an exception of its own), and not for kiln's own errors: the error goes on
    as it is."""
    if torch._C._current_graph_task_id() != -1 or type(error).__module__.startswith("kiln."):
        raise error  # (kiln's own errors, a safe kernel's bounds check, are reports, not the program's)
    code = F.__code__
    log("graph_breaks", "the graph of %s raised %s: %s; the frame runs again eagerly, from its start",
        code.co_qualname, type(error).__name__, error)
    args, kwargs = unbind(code, L)
    return F(*args, **kwargs)


def unbind(code, L):
    """(args, kwargs) that bind to the parameters L holds (the order runtime.make_binder returns)."""
    n, k = code.co_argcount, code.co_kwonlyargcount
    args, kwargs = list(L[:n]), dict(zip(code.co_varnames[n:n + k], L[n:n + k]))
    rest = n + k
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(L[rest])
        rest += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(L[rest])
    return args, kwargs
