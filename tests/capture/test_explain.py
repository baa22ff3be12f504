"""kiln.explain(fn)(*args): graph count, break count, break reasons with source lines, ops per
graph and guards, for a function with one graph break."""
import inspect
import os

import pytest
import torch

import kiln
from tests.utils import CompileCounter

THIS_FILE = os.path.basename(__file__)


def one_break(x):
    y = torch.sin(x) + 1
    print("break here")  # BREAK
    return torch.cos(y)


def no_break(x):
    return torch.relu(x * 2)


def break_line():
    lines, start = inspect.getsourcelines(one_break)
    return start + next(i for i, line in enumerate(lines) if "# BREAK" in line)


def op_counts(explanation):
    return [len(ops) if isinstance(ops, (list, tuple)) else ops for ops in explanation.ops_per_graph]


@pytest.fixture
def explained(capsys):
    return kiln.explain(one_break)(torch.randn(3))


def test_counts_graphs_and_breaks(explained):
    assert explained.graph_count == 2
    assert explained.graph_break_count == 1


def test_break_reason_names_construct_and_source_line(explained):
    assert len(explained.break_reasons) == 1
    reason = str(explained.break_reasons[0])
    assert "print" in reason
    assert THIS_FILE in reason and str(break_line()) in reason


def test_ops_per_graph(explained):
    assert op_counts(explained) == [2, 1]


def test_guards_mention_the_input(explained):
    assert len(explained.guards) >= 1
    assert any("x" in str(guard) for guard in explained.guards)


def test_no_break_function():
    explanation = kiln.explain(no_break)(torch.randn(3))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    assert list(explanation.break_reasons) == [] and op_counts(explanation) == [2]


def test_explain_does_not_pollute_the_cache():
    kiln.explain(no_break)(torch.randn(3))
    counter = CompileCounter()
    kiln.compile(no_break, backend=counter)(torch.randn(3))
    assert counter.frame_count == 1


@pytest.mark.kiln_only
def test_explain_report_text(capsys):
    explanation = kiln.explain(one_break)(torch.randn(3))
    text = str(explanation) + capsys.readouterr().out
    assert "2" in text and THIS_FILE in text


@pytest.mark.kiln_only
def test_tensor_guard_states_dtype_and_shape(explained):
    tensor_guards = [str(g) for g in explained.guards if "L['x']" in str(g)]
    assert any("float32" in g and "3" in g for g in tensor_guards), tensor_guards


def test_explain_module_with_a_break(capsys):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

        def forward(self, x):
            y = self.a(x)
            print("between layers")
            return self.b(y)
    explanation = kiln.explain(M())(torch.randn(2, 3))
    assert explanation.graph_count == 2 and explanation.graph_break_count == 1


@pytest.mark.kiln_only
def test_global_state_guards_listed_once_across_frames():
    explanation = kiln.explain(one_break)(torch.randn(3))
    grad_guards = [str(g) for g in explanation.guards if "is_grad_enabled" in str(g)]
    assert len(grad_guards) == 1, grad_guards


def test_explain_returns_its_report_without_printing(capsys):
    def no_print(x):
        return (x + 1).relu()
    explanation = kiln.explain(no_print)(torch.randn(3))
    assert explanation.graph_count == 1
    assert capsys.readouterr().out == ""
