"""The training-graph cache: a graph compiled for training once (forward and backward) loads again
without a joint trace, partition or codegen and gives eager's outputs, gradients and buffer writes;
what changes the compiled graphs misses; a damaged entry is compiled again. (The two-process test,
a fresh interpreter that imports no aot at all, is tests/capture/test_capture_cache.py's training
test.)"""
import copy

import pytest
import torch

from kiln.compiler import compile_fx, graph_cache
from kiln.compiler.training_runtime import TrainingRun
from tests.compiler.test_graph_cache import cache  # noqa: F401 (the fixture: a fresh cache, fresh counters)


class Block(torch.nn.Module):
    """A linear layer, a batch norm in training mode (running stats: buffers the graph writes) and a
    tanh, written functionally (symbolic_trace keeps nn.Linear as a submodule call, which no cache keeps)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(5, 6))
        self.w = torch.nn.Parameter(torch.randn(5))
        self.register_buffer("mean", torch.zeros(5))
        self.register_buffer("var", torch.ones(5))

    def forward(self, x):
        y = torch.nn.functional.batch_norm(x @ self.weight.t(), self.mean, self.var, self.w, None, training=True)
        return torch.tanh(y), y.sum(1)


def step_and_check(model, x, *, backward=True):
    """Compile `model` (a fresh copy's fx trace) for `x`, run one step and compare outputs, gradients
    and buffers with eager on an identical copy; returns the compiled training graph."""
    model.zero_grad(set_to_none=True)
    eager = copy.deepcopy(model)
    compiled = compile_fx(torch.fx.symbolic_trace(model), [x])
    x_eager = x.detach().clone().requires_grad_(x.requires_grad)
    out, expected = compiled(x), eager(x_eager)
    torch.testing.assert_close(out, expected)
    if backward:
        (out[0].sum() + out[1].square().sum()).backward()
        (expected[0].sum() + expected[1].square().sum()).backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        if x.requires_grad:
            torch.testing.assert_close(x.grad, x_eager.grad)
    for b, c in zip(model.buffers(), eager.buffers()):
        torch.testing.assert_close(b, c)
    [graph] = compiled.variants.values()
    return graph


def counts():
    s = graph_cache.stats
    return s.hits, s.misses, s.stores


def test_second_compile_loads_forward_and_backward(cache):
    torch.manual_seed(0)
    model = Block()
    first = step_and_check(model, torch.randn(4, 6, requires_grad=True))
    assert counts() == (0, 1, 1) and type(first) is not TrainingRun  # traced
    again = step_and_check(model, torch.randn(4, 6, requires_grad=True))
    assert counts() == (1, 1, 1) and type(again) is TrainingRun  # loaded: no trace, no partition
    assert again.forward.kiln_source and again.backward  # (inspection attributes kept)


def test_nothing_is_stored_before_the_first_backward(cache):
    torch.manual_seed(0)
    step_and_check(Block(), torch.randn(4, 6), backward=False)
    assert counts() == (0, 1, 0) and not list((cache / "training").rglob("*.json"))


def test_which_inputs_need_grad_is_part_of_the_key(cache):
    torch.manual_seed(0)
    model = Block()
    step_and_check(model, torch.randn(4, 6, requires_grad=True))
    step_and_check(model, torch.randn(4, 6))
    assert counts() == (0, 2, 2)


def test_a_damaged_entry_is_compiled_again(cache):
    torch.manual_seed(0)
    model = Block()
    step_and_check(model, torch.randn(4, 6))
    [entry] = (cache / "training").rglob("*.json")
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0x5A
    entry.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="damaged"):
        graph = step_and_check(model, torch.randn(4, 6))
    assert counts() == (0, 2, 2) and type(graph) is not TrainingRun
    step_and_check(model, torch.randn(4, 6))
    assert counts() == (1, 2, 2)
