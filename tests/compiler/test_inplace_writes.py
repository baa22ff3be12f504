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
