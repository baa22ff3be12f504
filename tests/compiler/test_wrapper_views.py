"""The wrapper's views (wrapper._Views): a tensor an extern reads through a view is viewed once per call,
not at all where it already has that layout, and a kernel-written buffer that externs read through one
layout is allocated in it; a buffer used whole (returned, or passed to aten as it is) keeps its own
shape. Every case against eager, also with gradients and dynamic sizes."""
import re

import torch
import torch.nn.functional as F

import kiln
from tests.compiler.test_compile_fx import check



def buffer_views(wrapper):
    """The views of intermediate buffers the wrapper makes before it returns (outputs aside)."""
    body = [line for line in wrapper.splitlines() if not line.lstrip().startswith("return")]
    return re.findall(r"\bbuf\d+\.as_strided\(", "\n".join(body))


def three_projections(x, w1, w2, w3, b):
    y = F.gelu(x)  # a kernel writes y as (2, 8, 16); the matmuls read it as (16, 16)
    return F.linear(y, w1, b), F.linear(y, w2), F.linear(y, w3)


def projection_args(batch=2):
    torch.manual_seed(batch)
    return torch.randn(batch, 8, 16), torch.randn(16, 16), torch.randn(16, 16), torch.randn(16, 16), torch.randn(16)


def test_matmul_operand_is_allocated_as_the_matmuls_read_it():
    c = check(three_projections, *projection_args())
    assert not buffer_views(c.kiln_wrapper), c.kiln_wrapper


def test_view_read_by_two_matmuls_is_made_once():
    def f(x, w1, w2):
        y = F.gelu(x)
        return y, F.linear(y, w1), F.linear(y, w2)  # y returned: it keeps its own shape
    c = check(f, *projection_args()[:3])
    assert len(buffer_views(c.kiln_wrapper)) == 1, c.kiln_wrapper
    x, w1, w2 = projection_args()[:3]
    assert c(x, w1, w2)[0].shape == (2, 8, 16)


def test_returned_buffer_written_over_another_keeps_its_shape():
    def f(a, b):
        y = a @ b
        z = torch.relu(y.view(2, 8, 16)) + 1  # stored over y's memory, and returned
        return z, torch.sort(z, -1).values      # and passed to aten as it is
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    c = check(f, a, b)
    assert [t.shape for t in c(a, b)] == [(2, 8, 16), (2, 8, 16)]


def test_written_over_buffer_read_by_a_matmul():
    def f(a, b, w):
        y = a @ b
        z = torch.tanh(y.view(2, 8, 16)) * 2  # stored over y's memory, then read by a matmul
        return F.linear(z, w)
    check(f, torch.randn(16, 16), torch.randn(16, 16), torch.randn(4, 16))


def test_gradients_match_eager():
    args = [t.requires_grad_() for t in projection_args()]
    compiled = kiln.compile(three_projections, fullgraph=True)
    sum(o.square().sum() for o in compiled(*args)).backward()
    got = [t.grad.clone() for t in args]
    for t in args:
        t.grad = None
    sum(o.square().sum() for o in three_projections(*args)).backward()
    for g, t in zip(got, args):
        torch.testing.assert_close(g, t.grad, rtol=1e-4, atol=1e-4)


def test_dynamic_sizes_match_eager():
    compiled = kiln.compile(three_projections, dynamic=True, fullgraph=True)
    for batch in (2, 3, 5):
        args = projection_args(batch)
        torch.testing.assert_close(compiled(*args), three_projections(*args), rtol=1e-5, atol=1e-5)


def test_linear_layers_call_aten_linear_without_views():
    """addmm(b, x, w.t()) / mm(x, w.t()) run as aten.linear(x, w, b), which makes that same call with w.t()
    taken in C++ (wrapper._as_linear); a product with an untransposed operand stays as it is."""
    def relu_projections(x, w1, w2, b):
        y = torch.relu(x)  # exact, so the products are eager's bit for bit
        return F.linear(y, w1, b), F.linear(y, w2)
    args = projection_args()[:3] + projection_args()[4:]
    c = check(relu_projections, *args)
    assert not re.search(r"\barg\d+\.as_strided\(", c.kiln_wrapper), c.kiln_wrapper
    assert all(torch.equal(got, want) for got, want in zip(c(*args), relu_projections(*args)))

    def mixed(x, w, v):
        y = torch.tanh(x)
        return F.linear(y, w * 2), y @ v  # a computed weight, and a plain product
    check(mixed, torch.randn(8, 16), torch.randn(4, 16), torch.randn(16, 4))


def test_externs_with_one_meaning_call_torchs_python_binding():
    """aten.convolution and aten.linear (one overload but out=) are called through torch.convolution and
    torch._C._nn.linear; mm (it has a dtype overload too) keeps op._op."""
    def f(x, w, lw, m):
        y = torch.relu(F.conv2d(x, w, padding=1))
        return F.linear(y.flatten(1), lw), y.flatten(1)[:, :8] @ m
    args = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(5, 144), torch.randn(8, 8)
    c = check(f, *args)
    suffixes = [suffix for _, suffix in re.findall(r"= (aten_\d+)(\._op)?\(", c.kiln_wrapper)]
    assert suffixes.count("") == 2 and suffixes.count("._op") == 1, c.kiln_wrapper


def test_a_view_through_aten_gets_the_strides_eager_gave_its_argument():
    """Under dynamic sizes a reshape of a strided slice runs through aten as clone + view; kiln's clone
    is the value itself (a view of the input), so the aten view got the slice's strides and raised.
    An extern whose result depends on its argument's strides now gets the traced ones (found by the
    random-program tester, dynamic seed 4600921)."""
    def f(a):
        t = a.chunk(2, 1)[0].reshape(2, 3, 4, 192)
        return torch.amin(t, (-2, 1)).int(), t.sum()
    compiled = kiln.compile(f, dynamic=True)
    a = torch.randn(9, 1024, dtype=torch.float64)
    for got, want in zip(compiled(a), f(a)):
        torch.testing.assert_close(got, want)


def test_a_view_at_the_start_of_its_buffer_keeps_its_offset_without_reading_it():
    def f(x, w):
        y = F.gelu(x)  # y is returned, so the matmul reads it through a view: at offset 0
        return y, y.transpose(0, 1).reshape(16, 16) @ w
    c = check(f, torch.randn(16, 16), torch.randn(16, 16))
    assert "as_strided" in c.kiln_wrapper and "storage_offset()" not in c.kiln_wrapper, c.kiln_wrapper


def test_checked_kernels_of_one_call_share_one_error_slot():
    table = torch.randn(10, 16)

    def f(i, j, w):
        a = F.embedding(i, table) @ w  # a checked kernel, a matmul, then a second checked kernel
        return F.embedding(j, table) + a
    w = torch.randn(16, 16)
    good, bad = torch.tensor([1, 2]), torch.tensor([3, 12])
    c = check(f, good, good.flip(0), w)
    assert c.kiln_wrapper.count("cpu_err = ") == 1 and c.kiln_wrapper.count("cpu_err_ptr)") == 2, c.kiln_wrapper
    for i, j in ((good, bad), (bad, good)):  # either kernel's failure raises as eager does
        try:
            f(i, j, w)
        except IndexError as e:
            expected = type(e)
        try:
            c(i, j, w)
        except expected:
            pass
        else:
            raise AssertionError("no error")
    torch.testing.assert_close(c(good, good, w), f(good, good, w))
