"""Numbers read out of tensor data (`Tensor.item()`, `Tensor.tolist()`) kept in the graph, and Python
`assert` statements on them checked when the graph runs.

torch.compile 2.13 captures `item()` into the graph when capture_scalar_outputs is on, and also under
`fullgraph=True` (where the alternative is an error, not a graph break); `tolist()` is one item() per
element. Such a number is an unbacked symbol (u0) of the ShapeEnv: capture does not know its value,
so a Python branch on it still cannot be followed (objects.truth refuses it). The one branch it can
follow is an `assert`: the program stops when the condition is false, so the graph carries the check
(aten._assert_scalar, which raises RuntimeError, as in torch.compile) and capture continues on the
path where it holds. The check runs on every call; nothing about the value is assumed without it."""
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from kiln.capture.variables import ConstantVariable, ListVariable, SymNodeVariable
from kiln.config import config
from kiln.exc import Unsupported


def captures_scalars(frame):
    """Whether item() and tolist() go into the graph in this frame: capture_scalar_outputs, or
    fullgraph=True (torch.compile's rule: there a graph break would be an error)."""
    capture = getattr(frame, "capture", None)
    return bool(config.capture_scalar_outputs or getattr(capture, "fullgraph", False))


def item(frame, t):
    """t.item(): a number the graph computes (an unbacked symbol)."""
    return frame.og.call_op("call_method", "item", [t], {})


def tolist(frame, t):
    """t.tolist(): nested lists of item() of each element. The sizes must be known numbers (one
    list item per element); a tensor of symbolic sizes is refused."""
    shape = tuple(t.fake.shape)
    if not all(type(s) is int for s in shape):
        raise Unsupported(f"Tensor.tolist() of a tensor of symbolic sizes {shape}", kind="data_dependent")
    if t.fake.is_complex():
        raise Unsupported("Tensor.tolist() of a complex tensor", kind="data_dependent")
    return _nested(frame, t, shape)


def _nested(frame, t, shape):
    if not shape:
        return item(frame, t)
    return ListVariable([_nested(frame, frame.og.call_op("call_method", "select", [t, ConstantVariable(0),
                                                                                  ConstantVariable(i)], {}),
                                 shape[1:]) for i in range(shape[0])])


# ---- assert on a number only the graph knows -----------------------------------------------------

def is_data_dependent(value):
    """A symbolic bool (or number) whose value depends on tensor data: capture cannot know it."""
    return isinstance(value, SymNodeVariable) and bool(free_unbacked_symbols(value.value))


def is_assert_branch(insts, index):
    """Whether the instruction at `index` starts an assert's failure path (LOAD_ASSERTION_ERROR; the
    compiler puts it first, before the message and RAISE_VARARGS)."""
    return 0 <= index < len(insts) and insts[index].opname == "LOAD_ASSERTION_ERROR"


def assert_in_graph(frame, cond, holds_when, where, what="assert"):
    """`assert` on `cond` (a data-dependent SymNodeVariable): the program goes on only when
    bool(cond) == holds_when. The graph checks it at run time (aten._assert_scalar raises
    RuntimeError when it fails); the ShapeEnv is told too (torch._check), so that sizes computed
    from the number later know what the check guarantees."""
    og = frame.og
    if not holds_when:
        cond = og.call_op("call_function", torch.sym_not, [cond], {})
        if not isinstance(cond, SymNodeVariable):  # folded to a constant: nothing left to check
            if not cond.value:
                raise Unsupported(f"assert that always fails at {where}", kind="data_dependent")
            return
    msg = f"{what} failed at {where}: {cond.value.node.expr}"
    node = og.graph.create_node("call_function", torch.ops.aten._assert_scalar.default, (cond.node, msg), {},
                                name=og._unique("_assert_scalar"))
    node.meta["example_value"] = None
    try:
        torch._check(cond.value)
    except Exception:  # noqa: BLE001 -- the ShapeEnv proves it false after earlier checks: every call
        pass           # fails it; the graph's check raises then, as eager's assert does


def known_truth(sym):
    """bool(sym) for a data-dependent SymBool the ShapeEnv can decide without a guard (the graph's
    checks so far imply it: `torch._check_is_size(n)` makes `n >= 0` true), else None. Nothing is
    assumed: what it knows comes from checks the graph runs on every call."""
    from torch.fx.experimental.symbolic_shapes import statically_known_false, statically_known_true
    if statically_known_true(sym):
        return True
    if statically_known_false(sym):
        return False
    return None


def check_in_graph(frame, cond, where):
    """torch._check(cond) on a data-dependent cond: checked when the graph runs (RuntimeError, as
    torch.compile's deferred runtime asserts), and known to the ShapeEnv from here on."""
    assert_in_graph(frame, cond, True, where, what="torch._check")
