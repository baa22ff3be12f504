"""memory_plan.inplace_writes: a kernel stores a value over the memory of an input it reads last, at
the element it stores (a batch norm + relu over a convolution's result); never where another read of
that memory could see the new value, or where the input is kept (returned, or a view of it lives on)."""
import re

import torch
import torch.nn.functional as F

from tests.compiler.test_compile_fx import check

INPLACE = re.compile(r"^\s*(buf\d+) = (buf\d+)(\.as_strided\(.*\))?$", re.M)


def conv_epilogue(x, w, m, v):
    y = F.conv2d(x, w, padding=1)
    return torch.relu((y - m[:, None, None]) * torch.rsqrt(v[:, None, None] + 1e-5))


def conv_args():
    return torch.randn(2, 3, 10, 10), torch.randn(6, 3, 3, 3), torch.randn(6), torch.rand(6) + 0.5


def test_epilogue_writes_over_the_convolution_result():
    c = check(conv_epilogue, *conv_args(), layout_optimization=False)  # the result is NCHW, as the convolution
    assert INPLACE.search(c.kiln_wrapper), c.kiln_wrapper


def test_returned_intermediate_is_not_written_over():
    def f(x, w, m, v):
        y = F.conv2d(x, w, padding=1)
        return y, torch.relu(y - m[:, None, None])
    c = check(f, *conv_args()[:3], torch.rand(6))
    assert not INPLACE.search(c.kiln_wrapper)


def test_read_at_another_element_is_not_written_over():
    def f(a, b):
        y = a @ b
        return y + y.t(), torch.relu(y.flip(0)) * 2
    check(f, torch.randn(16, 16), torch.randn(16, 16))


def test_a_later_reader_keeps_the_memory():
    def f(x, w, m, v):
        y = F.conv2d(x, w, padding=1)
        z = torch.relu(y - m[:, None, None])
        return z * y.sum(), y.amax(1)  # y is read again after z is stored
    check(f, *conv_args())


def test_view_of_an_aten_result_kept_alive_is_not_written_over():
    def f(a, b):
        y = a @ b
        v = y.view(-1)  # an alias of y's memory, returned
        return v, torch.sigmoid(y) + 1
    c = check(f, torch.randn(8, 8), torch.randn(8, 8))
    assert not INPLACE.search(c.kiln_wrapper)


def squeeze_excite(x, w, m, v, w1, w2):
    """EfficientNet's block: silu(bn(conv)) (silu reads the normalized value twice, kept in a
    register), its spatial mean through two 1x1 convolutions to a per-channel scale, times it."""
    y = F.silu((F.conv2d(x, w, padding=1) - m[:, None, None]) * torch.rsqrt(v[:, None, None] + 1e-5))
    s = torch.sigmoid(F.conv2d(F.silu(F.conv2d(y.mean((2, 3), keepdim=True), w1)), w2))
    return F.conv2d(y * s, w2.transpose(0, 1))


def squeeze_excite_args():
    return (*conv_args(), torch.randn(2, 6, 1, 1), torch.randn(6, 2, 1, 1))


def test_value_read_through_a_register_is_written_over_its_input():
    c = check(squeeze_excite, *squeeze_excite_args(), layout_optimization=False)
    aliases = dict((m.group(1), m.group(2)) for m in INPLACE.finditer(c.kiln_wrapper))
    # silu(bn(conv)) over the convolution's result, then y * s over that same memory
    assert any(b in aliases for b in aliases.values()), c.kiln_wrapper


def test_value_read_through_a_register_and_read_again_later_is_not_written_over():
    def f(x, w, m, v):
        y = F.conv2d(x, w, padding=1)
        z = F.silu(y - m[:, None, None])  # y - m read twice by silu, through a register
        return z * 2, y.amax(1)          # y is read after z is stored
    c = check(f, *conv_args())
    assert not INPLACE.search(c.kiln_wrapper), c.kiln_wrapper


def test_squeeze_excite_channels_last_matches_eager():
    x, *rest = squeeze_excite_args()
    check(squeeze_excite, x.to(memory_format=torch.channels_last), *rest)
