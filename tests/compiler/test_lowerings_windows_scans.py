"""Pooling, cumulative scans and scatter-style ops lowered to kiln kernels (not aten), against eager.

Every case compiles with `compile_fx`, compares with eager (values and indices exactly where eager
is exact: max pooling's indices with ties, NaN and -inf; cummax/cummin's), and asserts the op did
not fall back to aten.
"""
import pytest
import torch
import torch.nn.functional as F

from kiln.compiler import compile_fx
from kiln.config import compiler_options

NAN, INF = float("nan"), float("inf")
aten = torch.ops.aten


def compiled(fn, *args):
    return compile_fx(torch.fx.symbolic_trace(fn), list(args), compiler_options(options={"debug": True}))


def check(fn, *args, rtol=None, atol=None):
    """Compile fn, compare with eager, require no aten fallback; returns the compiled callable."""
    c = compiled(fn, *args)
    torch.testing.assert_close(c(*args), fn(*args), rtol=rtol, atol=atol, equal_nan=True)
    assert c.kiln_fallbacks == [], c.kiln_fallbacks
    assert c.kiln_kernels
    return c


def with_ties_nan_inf(shape, dtype=torch.float32, seed=0):
    """Small integers (many ties), a NaN, and a corner of -inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, shape, generator=g).to(dtype)
    if dtype.is_floating_point:
        x.view(-1)[3] = NAN
        x[..., :2, :2] = -INF
    return x


# ---- pooling -----------------------------------------------------------------------------------

MAX_POOL_PARAMS = [  # kernel, stride, padding, dilation, ceil_mode
    (2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True), ((2, 3), (1, 2), (1, 0), (2, 1), True),
    (3, 1, 1, 2, False), ((1, 4), (3, 1), (0, 2), 1, True), (4, 3, 2, 1, True),
    (5, 2, 2, 1, True), ((5, 4), 3, (2, 1), (1, 2), False),  # windows too big to unroll: reduction loops
]


@pytest.mark.parametrize("params", MAX_POOL_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_max_pool2d_values_and_indices(params, dtype):
    k, s, p, d, ceil = params
    x = with_ties_nan_inf((2, 3, 9, 11), dtype)
    check(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=ceil, return_indices=True), x)


def test_max_pool2d_all_minus_inf_window_points_at_its_first_valid_position():
    x = torch.full((1, 1, 5, 5), -INF)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, return_indices=True), x)


@pytest.mark.parametrize("layout", ["transposed", "channels_last", "unbatched"])
def test_max_pool2d_strided_inputs(layout):
    x = with_ties_nan_inf((2, 3, 10, 8))
    x = {"transposed": x.transpose(2, 3), "channels_last": x.to(memory_format=torch.channels_last),
         "unbatched": x[0]}[layout]
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)


def test_max_pool_1d_and_3d():
    check(lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True, return_indices=True), with_ties_nan_inf((2, 3, 13)))
    check(lambda x: F.max_pool3d(x, (2, 3, 2), 2, 1, dilation=(1, 1, 2), return_indices=True),
          with_ties_nan_inf((2, 2, 5, 6, 7)))


def test_relu_max_pool_add_fuses_producer_and_consumer():
    x = torch.randn(2, 4, 12, 12)
    c = check(lambda x: F.max_pool2d(F.relu(x) * 2, 2) + 1, x)
    assert len(c.kiln_kernels) == 1


AVG_POOL_PARAMS = [  # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    (2, None, 0, False, True, None), (3, 2, 1, False, True, None), (3, 2, 1, True, False, None),
    ((2, 3), (1, 2), (1, 1), True, True, None), (3, 2, 1, True, True, 5), ((3, 1), 2, (1, 0), False, False, 2),
    (5, 3, 2, True, False, None), ((6, 4), 2, (3, 2), False, True, None),
]


@pytest.mark.parametrize("params", AVG_POOL_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_avg_pool2d(params, dtype):
    k, s, p, ceil, include_pad, divisor = params
    x = torch.randint(-9, 10, (2, 3, 9, 10)).to(dtype) if dtype == torch.int64 else torch.randn(2, 3, 9, 10, dtype=dtype)
    check(lambda x: F.avg_pool2d(x, k, s, p, ceil, include_pad, divisor), x)


def test_avg_pool_1d_3d_and_nan():
    x = torch.randn(2, 3, 9, 10)
    x[0, 0, 4, 4] = NAN
    x[1, 1, 0, 0] = INF
    check(lambda x: F.avg_pool2d(x, 3, 2, 1), x)
    check(lambda x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True), torch.randn(2, 3, 14))
    check(lambda x: F.avg_pool3d(x, 2, ceil_mode=True, count_include_pad=False, padding=1), torch.randn(2, 2, 5, 6, 7))


@pytest.mark.parametrize("out", [(4, 5), (3, 11), (1, 1), (9, 2), (7, 3), 5])
def test_adaptive_avg_and_max_pool2d(out):
    x = with_ties_nan_inf((2, 3, 9, 11))
    check(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), x)
    y = torch.randn(2, 3, 9, 11, dtype=torch.float64)
    check(lambda y: F.adaptive_avg_pool2d(y, out), y)


def test_adaptive_pool_1d_3d_and_strided():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), torch.randn(2, 3, 13))
    check(lambda x: F.adaptive_max_pool1d(x, 5, return_indices=True), torch.randn(2, 3, 13))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), torch.randn(2, 2, 5, 6, 7))
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 4), return_indices=True), torch.randn(2, 2, 5, 6, 7))
    check(lambda x: F.adaptive_avg_pool2d(x.transpose(2, 3), (3, 4)), torch.randn(2, 3, 10, 7))


# ---- scans -------------------------------------------------------------------------------------

SCANS = {
    "cumsum": lambda x, d: torch.cumsum(x, d), "cumprod": lambda x, d: torch.cumprod(x, d),
    "logcumsumexp": lambda x, d: torch.logcumsumexp(x, d), "cummax": lambda x, d: torch.cummax(x, d),
    "cummin": lambda x, d: torch.cummin(x, d),
}


@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_scans(name, dim, dtype):
    if name == "logcumsumexp" and dtype == torch.int64:
        pytest.skip("eager has no integer logcumsumexp")
    x = torch.randint(-3, 4, (5, 7, 6)).to(dtype)
    if dtype.is_floating_point:
        x = x + torch.rand(5, 7, 6, dtype=dtype) * (0.5 if name != "cumprod" else 0.1)
        x[1, 2, 3], x[2, 0, 1], x[3, 4, 0] = NAN, INF, -INF
    fn = SCANS[name]
    check(lambda x: fn(x, dim), x)


@pytest.mark.parametrize("name", list(SCANS))
def test_scans_of_strided_and_fused_inputs(name):
    fn = SCANS[name]
    x = torch.randn(6, 9)
    check(lambda x: fn(x.t(), 1), x)
    check(lambda x: fn(torch.relu(x) * 0.5 + 0.1, 0), x)


def test_cumsum_of_bools_and_int32_gives_int64_and_dtype_argument():
    x = torch.randn(4, 9)
    check(lambda x: torch.cumsum(x > 0, 1), x)
    check(lambda x: torch.cumprod((x * 3).to(torch.int32), 0), x)
    check(lambda x: torch.cumsum(x, 1, dtype=torch.float64), x)
    check(lambda x: torch.cummax(x > 0, 1), x)


def test_float32_cumsum_of_a_long_row_accumulates_like_eager():
    x = torch.full((2, 200000), 0.1)
    check(lambda x: torch.cumsum(x, 1), x)


def test_scan_of_a_0d_tensor():
    check(lambda x: (torch.cumsum(x, 0), torch.cummax(x, -1)), torch.tensor(2.5))


# ---- scatter -----------------------------------------------------------------------------------

def scatter_inputs(dtype=torch.float32, seed=0):
    """self (4, 6), src (4, 6), an index along dim 1 and one along dim 0 (3, 5) with duplicates."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-5, 6, (4, 6), generator=g).to(dtype)
    src = torch.randint(-5, 6, (4, 6), generator=g).to(dtype)
    return x, src, torch.randint(0, 6, (3, 5), generator=g), torch.randint(0, 4, (3, 5), generator=g)


SCATTERS = {
    "scatter_src": lambda x, s, i, i0: x.scatter(1, i, s),
    "scatter_dim0": lambda x, s, i, i0: x.scatter(0, i0, s),
    "scatter_value": lambda x, s, i, i0: x.scatter(-1, i, 2.0),
    "scatter_add": lambda x, s, i, i0: x.scatter_add(1, i, s),
    "scatter_add_dim0": lambda x, s, i, i0: x.scatter_add(-2, i0, s),
    "scatter_reduce_add": lambda x, s, i, i0: x.scatter(1, i, s, reduce="add"),
    "index_add": lambda x, s, i, i0: x.index_add(1, i[0], s[:, :5]),
    "index_put": lambda x, s, i, i0: x.index_put((i0[0],), s.repeat(2, 1)[:5]),
    "index_put_acc": lambda x, s, i, i0: x.index_put((i0[0],), s.repeat(2, 1)[:5], accumulate=True),
    "index_put_2d": lambda x, s, i, i0: x.index_put((i0, i - 6), s[:3, :5]),
    "index_put_2d_acc": lambda x, s, i, i0: x.index_put((i0, i), s[:3, :5], accumulate=True),
    "index_put_scalar_acc": lambda x, s, i, i0: x.index_put((i0, i), torch.tensor(3).to(x.dtype), accumulate=True),
    "index_put_second_dim": lambda x, s, i, i0: aten.index_put(x, [None, i[0]], s[:, :5], True),
    "index_put_apart": lambda x, s, i, i0: aten.index_put(x[None].expand(2, 4, 6), [i0[0] % 2, None, i[0]],
                                                           s[:, :5].t()),
    "index_put_mask": lambda x, s, i, i0: x.index_put((x[:, 0] > 0,), s[0]),
    "index_put_mask_2d_acc": lambda x, s, i, i0: x.index_put((x > 0,), torch.tensor(2).to(x.dtype), accumulate=True),
    "index_put_mask_second_dim": lambda x, s, i, i0: aten.index_put(x, [None, s[0] > 0], s[:, :1]),
    "index_copy": lambda x, s, i, i0: x.index_copy(1, torch.tensor([0, 3]), s[:, :2]),
    "index_fill": lambda x, s, i, i0: x.index_fill(1, torch.tensor([0, 3]), -1),
}


REDUCES = ["sum", "prod", "mean", "amax", "amin"]


@pytest.mark.parametrize("name", list(SCATTERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_scatters(name, dtype):
    check(SCATTERS[name], *scatter_inputs(dtype))


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    x, src, i, i0 = scatter_inputs(dtype)
    if dtype.is_floating_point:
        src[1, 2] = NAN
    check(lambda x, s, i: x.scatter_reduce(1, i, s, reduce, include_self=include_self), x, src, i)
    check(lambda x, s, i: x.scatter_reduce(0, i, s, reduce, include_self=include_self), x, src, i0)


def test_scatter_of_strided_and_fused_operands():
    x, src, i, i0 = scatter_inputs()
    check(lambda x, s, i: (torch.relu(x).t().scatter_add(0, i.t(), s.t() * 2) + 1).sum(1), x, src, i)


def test_scatter_writes_large_outputs_in_parallel_like_eager():
    x, src = torch.randn(300, 200), torch.randn(300, 200)
    i = torch.randint(0, 200, (300, 150))
    check(lambda x, s, i: x.scatter(1, i, s), x, src, i)
    check(lambda x, s, i: x.scatter_add(1, i, s), x, src, i)
    # along dim 0 the scattered dim comes first: threads own columns, each walking the rows in order
    i0 = torch.randint(0, 300, (300, 150))
    check(lambda x, s, i: x.scatter(0, i, s), x, src, i0)
    check(lambda x, s, i: x.scatter_reduce(0, i, s, "amax", include_self=False), x, src, i0)
    w, rows = torch.randn(2000, 64), torch.randint(-2000, 2000, (600,))
    check(lambda w, g, i: w.index_put((i,), g, accumulate=True), w, torch.randn(600, 64), rows)
    # eager's own non-accumulating index_put is parallel here: which duplicate wins is not fixed
    check(lambda w, g, i: w.index_put((i,), g), w, torch.randn(600, 64), torch.randperm(2000)[:600] - 1000)


@pytest.mark.parametrize("name, bad", [("scatter_src", 6), ("scatter_src", -1), ("scatter_add", 7),
                                       ("index_put_acc", 4), ("index_put", -5)])
def test_out_of_range_index_raises_like_eager(name, bad):
    fn = SCATTERS[name]
    x, src, i, i0 = scatter_inputs()
    c = compiled(fn, x, src, i, i0)
    assert c.kiln_fallbacks == []
    i, i0 = i.clone(), i0.clone()
    (i if name.startswith("scatter") else i0)[0, 1] = bad
    with pytest.raises((RuntimeError, IndexError)):
        fn(x, src, i, i0)
    with pytest.raises((RuntimeError, IndexError)):
        c(x, src, i, i0)


@pytest.mark.parametrize("dim, start, end, step", [(1, 1, 5, 2), (0, None, None, 1), (-1, -4, None, 3),
                                                   (1, 2, 100, 1), (0, 1, 3, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_slice_scatter(dim, start, end, step, dtype):
    x = torch.randn(5, 7).to(dtype)
    src = torch.zeros_like(x)[(slice(None),) * (dim % 2) + (slice(start, end, step),)] - 3
    check(lambda x, s: torch.slice_scatter(x * 2, s + 1, dim, start, end, step), x, src)


# ---- pooling backward ----------------------------------------------------------------------------

@pytest.mark.parametrize("params", MAX_POOL_PARAMS[:4] + MAX_POOL_PARAMS[-1:])
def test_max_pool2d_backward_adds_gradients_at_the_saved_indices(params):
    k, s, p, d, ceil = params
    x = with_ties_nan_inf((2, 3, 9, 11))
    out, idx = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil, return_indices=True)
    grad = torch.randn_like(out)
    s = s or k
    check(lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, k, s, p, d, ceil, i), grad, x, idx)


def test_max_pool3d_and_adaptive_max_backward():
    x = torch.randn(2, 2, 5, 6, 7)
    out, idx = F.max_pool3d(x, 3, 2, 1, return_indices=True)
    check(lambda g, x, i: aten.max_pool3d_with_indices_backward(g, x, 3, 2, 1, 1, False, i), torch.randn_like(out), x, idx)
    x = torch.randn(2, 3, 9, 11)
    out, idx = F.adaptive_max_pool2d(x, (4, 5), return_indices=True)
    check(lambda g, x, i: aten.adaptive_max_pool2d_backward(g, x, i), torch.randn_like(out), x, idx)


@pytest.mark.parametrize("params", AVG_POOL_PARAMS)
def test_avg_pool2d_backward(params):
    k, s, p, ceil, include_pad, divisor = params
    x = torch.randn(2, 3, 9, 10, dtype=torch.float64)
    grad = torch.randn_like(F.avg_pool2d(x, k, s, p, ceil, include_pad, divisor))
    s = s or k
    check(lambda g, x: aten.avg_pool2d_backward(g, x, k, s, p, ceil, include_pad, divisor), grad, x)


@pytest.mark.parametrize("out", [(4, 5), (3, 11), (1, 1), 5])
def test_adaptive_avg_pool_backward(out):
    x = torch.randn(2, 3, 9, 11)
    grad = torch.randn_like(F.adaptive_avg_pool2d(x, out))
    check(lambda g, x: aten._adaptive_avg_pool2d_backward(g, x), grad, x)
    x3 = torch.randn(2, 2, 5, 6, 7)
    grad3 = torch.randn_like(F.adaptive_avg_pool3d(x3, (2, 3, 4)))
    check(lambda g, x: aten._adaptive_avg_pool3d_backward(g, x), grad3, x3)


def test_training_through_pooling_scans_and_scatter_matches_eager_gradients():
    import kiln

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8 * 4 * 4, 5)

        def forward(self, x):
            y = F.avg_pool2d(F.max_pool2d(F.relu(self.conv(x)), 3, 2, 1), 2, ceil_mode=True)
            y = torch.cumsum(y, 1).flatten(1)
            return self.head(y).scatter_add(1, torch.zeros(x.shape[0], 2, dtype=torch.long), y[:, :2])

    torch.manual_seed(0)
    eager, x = Net(), torch.randn(2, 3, 16, 16)
    mine = Net()
    mine.load_state_dict(eager.state_dict())
    compiled_net = kiln.compile(mine)
    torch.testing.assert_close(compiled_net(x), eager(x))
    eager(x).square().sum().backward()
    compiled_net(x).square().sum().backward()
    for p, q in zip(eager.parameters(), mine.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("offset, dim1, dim2", [(0, 0, 1), (2, 0, 1), (-1, 1, 0), (1, -1, 0), (-2, 0, 2)])
def test_diagonal_scatter(offset, dim1, dim2):
    x = torch.randn(4, 6, 5)
    src = torch.diagonal(x, offset, dim1, dim2).clone() * 0 - 7
    check(lambda x, s: torch.diagonal_scatter(x + 1, s, offset, dim1, dim2), x, src)


def test_empty_slice_and_diagonal_scatter():
    x = torch.randn(3, 4)
    check(lambda x, s: torch.slice_scatter(x, s, 1, 2, 2) + 1, x, torch.empty(3, 0))
    check(lambda x, s: torch.diagonal_scatter(x, s, 5) + 1, x, torch.empty(0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_pool_and_scan_in_float(dtype):
    x = torch.randn(2, 3, 9, 11).to(dtype)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    check(lambda x: (F.avg_pool2d(x, 3, 2, 1), F.adaptive_avg_pool2d(x, (4, 5))), x)
    check(lambda x: (torch.cumsum(x, -1), torch.cummax(x, 2), torch.logcumsumexp(x, 1)), x)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_reduce(reduce, include_self, dtype):
    x, src, i, i0 = scatter_inputs(dtype)
    check(lambda x, s, i: x.index_reduce(1, i[0], s[:, :5], reduce, include_self=include_self), x, src, i)
    check(lambda x, s, i: x.index_reduce(-2, i[0], s.repeat(2, 1)[:5], reduce, include_self=include_self), x, src, i0)


def test_scatters_into_0d_tensors():
    x, s, i = torch.tensor(1.5), torch.tensor(-2.0), torch.tensor(0)
    check(lambda x, s, i: (x.scatter(0, i, s), x.scatter_add(-1, i, s), x.scatter_reduce(0, i, s, "amax")), x, s, i)
    check(lambda x, s, i: x.index_reduce(0, i[None], s, "mean", include_self=False), x, s, i)


@pytest.mark.parametrize("name", list(SCANS))
def test_scans_along_an_outer_dim_over_several_blocks_of_the_last(name):
    x = torch.randn(3, 9, 130, dtype=torch.float64)
    x[1, 4, 70], x[2, 0, 129] = NAN, -INF
    check(lambda x: SCANS[name](x, 1), x)


def test_one_compile_serves_several_sizes_with_dynamic_shapes():
    import kiln

    def fn(x, i):
        pooled = F.max_pool2d(x[None], 3, 2, 1, return_indices=True)
        return pooled, torch.cumsum(x, 1), torch.cummax(x, 0), x.scatter_add(2, i, x)

    compiled_fn = kiln.compile(fn, dynamic=True)
    for n in (5, 8, 11):
        x, i = torch.randn(3, n, n), torch.randint(0, n, (3, n, n))
        torch.testing.assert_close(compiled_fn(x, i), fn(x, i))
