"""The graphs hold the tensor work (not the glue): op counts per graph for unambiguous programs,
Python arithmetic folded away, loops unrolled, and the graph's inputs are the tensors used."""
import pytest
import torch
from torch import nn

import kiln
from tests.utils import CompileCounter


def compile_run(fn, *args):
    counter = CompileCounter()
    out = kiln.compile(fn, backend=counter)(*args)
    torch.testing.assert_close(out, fn(*args))
    return counter


def ops_in(gm):
    return sum(n.op.startswith("call") for n in gm.graph.nodes)


def chained_methods(x):
    return x.sin().cos() + 1


def python_arithmetic_folded(x):
    k = (2 + 3) * 4 // 2
    return x * k


def unrolled_loop(x):
    for i in range(4):
        x = x + i
    return x


def metadata_only_branching(x):
    if x.shape[0] > 2 and x.dtype == torch.float32:
        return x.relu()
    return x.tanh()


MLP = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4), nn.GELU())


def module_call(x):
    return MLP(x)


@pytest.mark.parametrize("fn, ops", [
    (chained_methods, 3), (python_arithmetic_folded, 1), (unrolled_loop, 4), (metadata_only_branching, 1),
    (module_call, 6),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_op_count(fn, ops):
    with torch.no_grad():
        counter = compile_run(fn, torch.randn(4, 4))
    assert counter.frame_count == 1 and counter.op_count == ops


def test_ops_split_across_a_break(capsys):
    def f(x):
        y = torch.sin(x) + 1
        print("break")
        return torch.cos(y)
    counter = compile_run(f, torch.randn(3))
    assert [ops_in(gm) for gm in counter.graphs] == [2, 1]


def test_graph_inputs_are_the_tensors_used():
    seen = []

    def backend(gm, example_inputs):
        seen.append(sorted(tuple(t.shape) for t in example_inputs))
        return gm.forward

    def f(a, b, unused, n):
        return a * n + b
    x, y, z = torch.randn(2), torch.randn(3, 1), torch.randn(5, 5)
    torch.testing.assert_close(kiln.compile(f, backend=backend)(x, y, z, 3), f(x, y, z, 3))
    assert seen == [[(2,), (3, 1)]]


def test_graph_runs_with_fresh_inputs_without_python():
    counter = compile_run(chained_methods, torch.randn(3))
    gm = counter.graphs[0]
    x = torch.randn(3)
    out = gm(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, chained_methods(x))
