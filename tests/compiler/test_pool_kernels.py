"""Pooling kernels as convolution nets use them: max pools without masks (the clamped position is
in the window anyway, so their loops vectorize), NaN and infinities as eager treats them."""
import pytest
import torch
import torch.nn.functional as F

from tests.compiler.test_compile_fx import check


def with_specials(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=g)[:12]
    flat[picks[:4]] = float("nan")
    flat[picks[4:8]] = float("-inf")
    flat[picks[8:]] = float("inf")
    x[..., 0, 0] = float("nan")  # a corner: read by padded windows only
    x[..., -1, :] = float("-inf")
    return x


def kernel_code(c):
    """The generated kernels' C++, without the prelude of helper functions."""
    return c.kiln_source.split("void kiln_entry", 1)[1]  # (kernels are named after what they compute)


@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), (3, 1, 1), (2, 2, 0), (5, 2, 2), (3, 3, 0)])
def test_max_pool_with_nan_and_infinities_matches_eager(kernel, stride, padding):
    x = with_specials((2, 3, 11, 12))
    c = check(lambda x: F.max_pool2d(x, kernel, stride, padding), x)
    if kernel <= 3:  # unrolled: no masked reads filled with -inf, as windows clamp
        assert "infinity" not in kernel_code(c)


def test_max_pool_with_indices_and_ceil_mode_match_eager():
    x = with_specials((2, 3, 9, 10), seed=1)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), x)
    check(lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2), x)


def test_maximum_and_minimum_propagate_nan_from_either_side():
    a, b = with_specials((4, 33)), with_specials((4, 33), seed=2)
    check(lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), torch.maximum(b, a)), a, b)


def test_padded_average_pool_masks_are_branch_free():
    x = torch.randn(2, 4, 10, 10)
    c = check(lambda x: F.avg_pool2d(x, 3, 1, 1), x)
    assert "&&" not in kernel_code(c) and "||" not in kernel_code(c)


@pytest.mark.parametrize("pool,kernel", [
    (lambda x: F.avg_pool2d(x, 2560, ceil_mode=True), 2560),            # HF EfficientNet's pooler
    (lambda x: F.avg_pool2d(x, 64, ceil_mode=True, count_include_pad=False), 64),
    (lambda x: F.max_pool2d(x, 64, ceil_mode=True, return_indices=True), 64),
    (lambda x: F.max_pool2d(x, 6, dilation=2, ceil_mode=True), 6),
])
def test_a_window_larger_than_the_input_loops_over_the_input_only(pool, kernel):
    """Offsets past the input are always masked: the kernel's window loops stop at the input's
    extent (a 2560x2560 window over a 1x1 map took seconds a call), and the answer is eager's."""
    import re
    import kiln
    x = torch.randn(2, 3, 7, 9, requires_grad=True)
    c = check(pool, x.detach())
    assert not re.search(rf"r\d+ < {kernel};", kernel_code(c))

    def first(y):
        return y[0] if isinstance(y, tuple) else y
    expected = torch.autograd.grad(first(pool(x)).sum(), x)[0]
    got = torch.autograd.grad(first(kiln.compile(pool)(x)).sum(), x)[0]
    torch.testing.assert_close(got, expected)
