"""nn.Module subclasses of the program's own built inside the compiled frame from values only the
frame knows (a tensor argument): followed through their __init__ into one graph, and built for real
after it (returned, kept across a break, called); eager is the oracle."""
import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_same, check_graphs


class Holder(torch.nn.Module):
    def __init__(self, data, scale=2):
        super().__init__()
        self._data = data
        self.width = scale * self.columns  # a property reading another property before __init__ ends

    @property
    def data(self):
        return self._data

    @property
    def columns(self):
        return self.data.shape[1]

    def forward(self, x):
        return x * self._data + self.width


class WithActivation(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = weight
        self.act = torch.nn.ReLU()

    def forward(self, x):
        if self.training:
            return self.act(x @ self.weight)
        return x @ self.weight


def returned(x):
    return Holder(x * 2)


def called(x, y):
    return Holder(x.sin(), scale=3)(y)


def with_submodule(x, w):
    m = WithActivation(w.t())
    return m(x), m.training


def kept_across_a_break(x):
    m = Holder(x + 1)
    print("between graphs")
    return m(x), m.width


@pytest.mark.parametrize("fn, args", [
    (returned, (torch.randn(3, 4),)),
    (called, (torch.randn(3, 4), torch.randn(3, 4))),
    (with_submodule, (torch.randn(2, 5), torch.randn(3, 5))),
], ids=["returned", "called", "with a submodule"])
def test_a_module_built_from_a_tensor_is_one_graph(fn, args):
    result = assert_same(fn, kiln.compile(fn, backend=CompileCounter(), fullgraph=True), *args)
    made = result if isinstance(result, torch.nn.Module) else None
    if made is not None:
        assert type(made) is Holder and made.width == 8 and made.data.shape == (3, 4)
        assert dict(made.named_parameters()) == {} and made.training


def test_the_returned_module_is_a_new_working_module_each_call():
    compiled = kiln.compile(returned, backend="eager", fullgraph=True)
    x = torch.randn(2, 3)
    a, b = compiled(x), compiled(x)
    assert a is not b and a._data is not b._data
    torch.testing.assert_close(a(torch.ones(2, 3)), x * 2 + 6)
    a.eval()  # a real module: its nn.Module machinery works
    assert not a.training and b.training


def test_a_module_kept_across_a_graph_break_is_rebuilt_for_the_rest():
    check_graphs(kept_across_a_break, torch.randn(2, 3), graphs=2)


class Buffered(torch.nn.Module):
    def __init__(self, t):
        super().__init__()
        self.register_buffer("t", t)

    def forward(self, x):
        return x + self.t


def registers_a_buffer(x):
    return Buffered(x.cos())(x)


def test_a_module_that_registers_a_buffer_gives_eagers_result():
    """register_buffer reads the module's internal dicts, which kiln does not model: a break, not a
    wrong module."""
    check_graphs(registers_a_buffer, torch.randn(3))
