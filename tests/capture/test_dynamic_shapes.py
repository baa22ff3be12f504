"""Sizes that change between calls: dynamic=None (static first, then symbolic), dynamic=True and
dynamic=False all give eager results for every size, including 0 and 1, and shape-driven Python."""
import pytest
import torch

import kiln
from tests.utils import CompileCounter


def branch_on_size(x):
    if x.shape[0] > 4:
        return x[:4] * 2
    return x * 3


def size_arithmetic(x):
    n = x.shape[0]
    return x.view(n // 2, 2).sum(-1) + torch.arange(n // 2) + x.new_zeros(n // 2 + 1)[1:]


def size_as_python_number(x):
    n = x.size(0)
    return x * n + n ** 2, n


def reshape_with_minus_one(x):
    return x.reshape(-1, 2).t().contiguous().view(-1) * x.numel()


def loop_over_size(x):
    out = x.new_zeros(())
    for i in range(x.shape[0]):
        out = out + x[i] * i
    return out


def mean_over_dims(x):
    return x.mean(dim=-1, keepdim=True) - x / x.shape[-1]


CASES = [
    (branch_on_size, [2, 6, 3, 8, 4, 5]),
    (size_arithmetic, [4, 6, 10, 2]),
    (size_as_python_number, [0, 1, 2, 5, 7]),
    (reshape_with_minus_one, [2, 4, 8, 6]),
    (loop_over_size, [1, 3, 4]),
    (mean_over_dims, [1, 2, 3, 9]),
]


def run_sizes(fn, sizes, dynamic):
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, dynamic=dynamic)
    for n in sizes:
        x = torch.randn(n) if fn is not mean_over_dims else torch.randn(3, n)
        torch.testing.assert_close(compiled(x), fn(x))
    return counter


@pytest.mark.parametrize("dynamic", [None, True, False], ids=["dynamic_none", "dynamic_true", "dynamic_false"])
@pytest.mark.parametrize("fn, sizes", CASES, ids=[c[0].__name__ for c in CASES])
def test_every_size_matches_eager(fn, sizes, dynamic):
    run_sizes(fn, sizes, dynamic)


def test_dynamic_false_compiles_per_size():
    counter = run_sizes(mean_over_dims, [1, 2, 3, 9], dynamic=False)
    assert counter.frame_count == 4


def test_dynamic_none_stops_recompiling_after_the_first_change():
    counter = run_sizes(mean_over_dims, [2, 3, 9, 17, 33], dynamic=None)
    assert counter.frame_count == 2


def test_noncontiguous_then_contiguous_inputs():
    def f(x):
        return x.view(-1)[:3] if x.is_contiguous() else x.reshape(-1)[:3] * 2
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    base = torch.randn(3, 4)
    for x in (base, base.t(), base[:, ::2], base.contiguous()):
        torch.testing.assert_close(compiled(x), f(x))


def test_zero_dim_tensor_argument():
    def f(x, s):
        return x * s + s.item() * 0
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    for s in (torch.tensor(2.0), torch.tensor(-1.0)):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, s), f(x, s))


def test_module_varying_batch_recompiles_at_most_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.GELU())
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    for batch in (2, 3, 5, 8, 13):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count <= 2


def test_varying_size_with_graph_break(capsys):
    def f(x):
        y = x.cumsum(0)
        print(y.shape[0])
        return y / y.shape[0]
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    for n in (2, 3, 6, 9):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))
    assert capsys.readouterr().out == "".join(f"{n}\n{n}\n" for n in (2, 3, 6, 9))
    assert counter.frame_count <= 4
