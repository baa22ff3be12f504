"""Real-code shapes from PyTorch's repro collection, written as our own programs: how a tensor is
iterated, TorchScript functions called from a frame, and other calls real models make."""
import operator
import warnings

import pytest
import torch

import kiln
from tests.utils import CompileCounter


def _nodes(counter):
    return [n.target for gm in counter.graphs for n in gm.graph.nodes if n.op.startswith("call")]


def rows_gathered(masks, index):
    return torch.stack([m[i.flatten()] for m, i in zip(masks, index)])


def test_iterating_a_tensor_takes_one_row_per_item():
    masks, index = torch.randn(3, 5, 4), torch.randint(0, 5, (3, 2, 2))
    counter = CompileCounter()
    out = kiln.compile(rows_gathered, backend=counter)(masks, index)
    torch.testing.assert_close(out, rows_gathered(masks, index))
    assert counter.frame_count == 1
    assert "unbind" not in _nodes(counter)  # x[0], x[1], ... as torch.compile records it: 6 row reads
    assert sum(t is operator.getitem for t in _nodes(counter)) == 3 * 2 + 3


def test_iterating_a_tensor_with_a_symbolic_first_dim_pins_it():
    def total(x):
        out = x[0] * 0
        for row in x:
            out = out + row
        return out
    counter = CompileCounter()
    f = kiln.compile(total, backend=counter, dynamic=True)
    for n in (3, 3, 4):
        x = torch.randn(n, 2)
        torch.testing.assert_close(f(x), total(x))
    assert counter.frame_count == 2  # the row count is part of the graph: a new count compiles again


def test_a_torchscript_function_is_traced_as_the_python_it_was_scripted_from():
    def scaled_cos(x, c: float = 2.0):
        return torch.cos(x) * c
    scripted = torch.jit.script(scaled_cos)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.f = scripted

        def forward(self, x):
            return self.f(x) + self.f(x, 0.5)

    mod, x = Holder(), torch.randn(4)
    counter = CompileCounter()
    out = kiln.compile(mod, backend=counter, fullgraph=True)(x)
    torch.testing.assert_close(out, mod(x))
    assert counter.frame_count == 1 and counter.op_count == 5


def test_tracing_a_compiled_function_with_torch_jit_is_an_error():
    def f(x):
        return x + 1
    compiled = kiln.compile(f, backend="eager")
    compiled(torch.randn(3))  # cached: the trace would hit the compiled entry
    with pytest.raises(RuntimeError, match="jit.trace"):
        torch.jit.trace(compiled, torch.randn(3))
    mod = kiln.compile(torch.nn.Linear(3, 3), backend="eager")
    with pytest.raises(RuntimeError, match="jit.trace"):
        torch.jit.trace(mod, torch.randn(3))
    torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 2.0))  # still runs afterwards


def _cos_scaled(x):
    return torch.cos(x) * 3


class _ShallowForward(torch.nn.Module):
    @kiln.disable(recursive=False)
    def forward(self, x):
        return _cos_scaled(x) + x.sin()  # the add and sin run eagerly; _cos_scaled compiles


def test_a_forward_disabled_non_recursively_runs_eagerly_and_its_callees_compile():
    mod = _ShallowForward()

    def f(x):
        return mod(x)
    x = torch.randn(4)
    counter = CompileCounter()
    torch.testing.assert_close(kiln.compile(f, backend=counter)(x), f(x))
    assert _nodes(counter) == [torch.cos, operator.mul]


def _length_quietly(v):
    with warnings.catch_warnings(record=True) as caught:
        n = len(v)
    return n, caught


def test_a_catch_warnings_block_is_captured_whole():
    def f(x):
        n, caught = _length_quietly(x)
        with warnings.catch_warnings():
            y = x * n
        return y + 1, caught
    x = torch.randn(5)
    counter = CompileCounter()
    out, caught = kiln.compile(f, backend=counter, fullgraph=True)(x)
    want, want_caught = f(x)
    torch.testing.assert_close(out, want)
    assert caught == want_caught == [] and type(caught) is list
    assert counter.frame_count == 1 and counter.op_count == 2
    with warnings.catch_warnings(record=True) as outside:  # the filters the block changed are restored
        warnings.simplefilter("always")
        warnings.warn("seen")
    assert len(outside) == 1


def tail_from_a_tensor_index(x, idx):
    y = x.sin() * 2
    tail = y[idx::1]  # a slice bound that is a tensor: BUILD_SLICE needs its value
    return (tail + 3) * 5


def sum_of_tails(x, starts):
    total = x.cos().sum()
    for s in starts:  # a break in a loop: the rest runs eagerly, no resume function per iteration
        total = total + x[s::1].sum()
    return total


@pytest.mark.parametrize("fn, args, ops", [
    (tail_from_a_tensor_index, (torch.randn(8), torch.tensor(3)), 2),
    (sum_of_tails, (torch.randn(6), torch.tensor([1, 4])), 4),  # cos, sum, and the loop's starts[0], starts[1]
], ids=["straight", "in_a_loop"])
def test_a_break_kiln_cannot_resume_after_compiles_the_graph_so_far(fn, args, ops):
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter)
    torch.testing.assert_close(compiled(*args), fn(*args))
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert counter.frame_count == 1 and counter.op_count == ops  # the graph before the slice; the rest eagerly


def _scaled(x, c=None):
    return (2 if c is None else c) * x


def test_kiln_compile_called_inside_a_compiled_frame_is_followed_into_its_graph():
    def outer(x):
        return kiln.compile(_scaled, backend="eager")(x) + 1
    x = torch.randn(4)
    counter = CompileCounter()
    torch.testing.assert_close(kiln.compile(outer, backend=counter, fullgraph=True)(x), outer(x))
    assert counter.frame_count == 1 and counter.op_count == 2
