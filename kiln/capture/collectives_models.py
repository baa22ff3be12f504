"""torch.distributed collectives in compiled code.

A collective must run exactly once per call on every rank, in program order, and never while
capturing (a collective run during capture would wait for a matching call the other ranks never
make, or pair with the wrong one). Every rank runs the same program through the same capture, so
what capture decides here is the same on every rank. Capture:

- records the synchronous in-place collectives that have a functional form as that form in the
  graph: `dist.all_reduce(t)` is `t.copy_(wait_tensor(_c10d_functional.all_reduce(t, "sum", group)))`,
  and likewise all_gather_into_tensor and reduce_scatter_tensor (the ones torch.compile remaps);
- follows the functional collectives' own Python (torch.distributed._functional_collectives: they
  call `torch.ops._c10d_functional` ops and wait on the result while compiling), with the questions
  they ask about process groups (names, sizes, ranks) answered natively: they cannot change while a
  group lives (a group object read from the frame is guarded by identity);
- breaks the graph at every other function of torch.distributed's c10d API (async_op=True, send and
  recv, broadcast, barrier, the object collectives, new_group, ...): it runs natively between graphs.
"""
import inspect
import types

import torch

from kiln.capture.objects import BUILTIN_HANDLERS, call_python_function, result_var
from kiln.capture.variables import ConstantVariable, ObjectVariable, Variable, const
from kiln.exc import Unsupported

try:
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol, distributed_c10d as c10d
    _OPS = torch.ops._c10d_functional
    _REDUCE_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "product",
                   dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max"}
except (ImportError, AttributeError):  # a torch built without torch.distributed
    dist = None


# ---- what the graph records for an in-place collective (inlined by capture) ---------------------------
def _all_reduce_into(tensor, op, group_name):
    tensor.copy_(_OPS.wait_tensor(_OPS.all_reduce(tensor, op, group_name)))


def _all_gather_into(output, input, group_size, group_name):
    gathered = _OPS.wait_tensor(_OPS.all_gather_into_tensor(input, group_size, group_name))
    output.copy_(gathered.reshape(output.shape))  # the output may be (world, *input.shape) or concatenated


def _reduce_scatter_into(output, input, op, group_size, group_name):
    output.copy_(_OPS.wait_tensor(_OPS.reduce_scatter_tensor(input.reshape(-1, *output.shape), op, group_size,
                                                             group_name)).reshape(output.shape))


def _python(frame, v, what):
    """The Python value of an argument that must be known at capture (a group, a reduce op, a flag)."""
    if not isinstance(v, Variable):  # a default the signature supplied
        return v
    if isinstance(v, ConstantVariable):
        return v.value
    if isinstance(v, ObjectVariable):
        if v.source is not None:
            frame.og.guards.id_match(v.source, v.value)
        return v.value
    raise Unsupported(f"{what} of a torch.distributed call is not a value known at capture")


def _group_name(frame, group):
    group = _python(frame, group, "the process group")
    return funcol._resolve_group_name(group if group is not None else dist.group.WORLD)


def _in_place(c10d_fn, record, *, reduces):
    """A handler capturing `c10d_fn(output..., op=, group=, async_op=False)` as `record`."""
    signature = inspect.signature(c10d_fn)
    name = c10d_fn.__name__

    def handler(frame, args, kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if _python(frame, a["async_op"], "async_op") is not False:
            raise Unsupported(f"torch.distributed.{name}(async_op=True) returns a Work handle: it runs outside the graph")
        group_name = _group_name(frame, a["group"])
        tensors = [v for k, v in a.items() if k not in ("op", "group", "async_op")]
        extra = [const(c10d._get_group_size_by_name(group_name))] if name != "all_reduce" else []
        if reduces:
            op = _python(frame, a["op"], "the reduce op")
            if op not in _REDUCE_OPS:
                raise Unsupported(f"torch.distributed.{name} with op={op!r}: it runs outside the graph")
            extra.insert(0, const(_REDUCE_OPS[op]))
        return call_python_function(frame, record, tensors + extra + [const(group_name)], {})
    return handler


def _answered_natively(fn):
    """A question about process groups (a name, a size, a rank), evaluated at capture."""
    def handler(frame, args, kwargs):
        values = [_python(frame, v, "an argument") for v in args]
        kw = {k: _python(frame, v, "an argument") for k, v in kwargs.items()}
        return result_var(frame.og, fn(*values, **kw))
    return handler


def _runs_natively(name):
    def handler(frame, args, kwargs):
        raise Unsupported(f"torch.distributed.{name} communicates with the other ranks: it runs outside the graph")
    return handler


# the helpers functional collectives call to name and size their process group
_GROUP_QUESTIONS = () if dist is None else (
    (c10d, "_get_group_size_by_name"), (c10d, "_resolve_process_group"), (c10d, "_get_default_group"),
    (funcol, "_resolve_group"), (funcol, "_resolve_group_name"), (funcol, "_group_or_group_name"))


def _register():
    captured = {c10d.all_reduce: _in_place(c10d.all_reduce, _all_reduce_into, reduces=True),
                c10d.all_gather_into_tensor: _in_place(c10d.all_gather_into_tensor, _all_gather_into, reduces=False),
                c10d.reduce_scatter_tensor: _in_place(c10d.reduce_scatter_tensor, _reduce_scatter_into, reduces=True)}
    BUILTIN_HANDLERS.update(captured)
    for name in c10d.__all__:
        fn = getattr(c10d, name)
        if type(fn) is not types.FunctionType or fn in captured:
            continue
        answers = name.startswith(("get_", "is_")) or name == "supports_complex"
        BUILTIN_HANDLERS[fn] = _answered_natively(fn) if answers else _runs_natively(name)
    for module, name in _GROUP_QUESTIONS:
        fn = getattr(module, name, None)  # (not every torch version has each)
        if fn is not None:
            BUILTIN_HANDLERS[fn] = _answered_natively(fn)


if dist is not None and dist.is_available():
    _register()
