"""Global interpreter and torch state touched by the region: Python's random module, warnings,
iterators passed in, grad mode set by a call, autocast, torch dtype info. All as eager."""
import random
import warnings

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs


def test_python_random_state_advances_as_eager():
    def f(x):
        return x * random.random() + random.randint(0, 5)
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.ones(2)
    random.seed(3)
    expected = [f(x), f(x)]
    after_eager = random.random()
    random.seed(3)
    actual = [compiled(x), compiled(x)]
    assert random.random() == after_eager
    torch.testing.assert_close(actual, expected)


def test_warning_emitted_every_call():
    def f(x):
        warnings.warn("careful")
        return x + 1
    compiled = kiln.compile(f, backend=CompileCounter())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(compiled(torch.ones(1)), torch.full((1,), 2.0))
    assert [str(w.message) for w in caught].count("careful") == 3


def test_iterator_argument_advanced_once_per_call():
    def f(x, it):
        return x * next(it)
    compiled = kiln.compile(f, backend=CompileCounter())
    it = iter([2.0, 3.0, 4.0])
    torch.testing.assert_close(compiled(torch.ones(1), it), torch.full((1,), 2.0))
    torch.testing.assert_close(compiled(torch.ones(1), it), torch.full((1,), 3.0))
    assert next(it) == 4.0


def test_grad_mode_set_by_a_call_persists_after():
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2
    compiled = kiln.compile(f, backend=CompileCounter())
    try:
        out = compiled(torch.ones(2, requires_grad=True))
        assert not torch.is_grad_enabled()
        assert not out.requires_grad
    finally:
        torch.set_grad_enabled(True)


def test_autocast_region_matches_eager():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        return y, y.dtype, (x @ w).dtype
    check_graphs(f, torch.randn(4, 4), torch.randn(4, 4), graphs=1)


def finfo_masking(x):
    mask = x > 0
    return x.masked_fill(mask, torch.finfo(x.dtype).min), torch.iinfo(torch.int32).max * 0 + x.sum()


def dtype_strings_and_flags(x):
    name = str(x.dtype)
    tag = 1 if name == "torch.float32" and x.dtype.is_floating_point and x.dtype.itemsize == 4 else 0
    return x * tag + torch.is_tensor(x) + torch.is_floating_point(x) + torch.numel(x)


def scripting_checks(x):
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return x
    return x * 2


@pytest.mark.parametrize("fn", [finfo_masking, dtype_strings_and_flags, scripting_checks], ids=lambda f: f.__name__)
def test_torch_introspection_one_graph(fn):
    check_graphs(fn, torch.randn(3, 3), graphs=1)
