"""Lowerings of pooling's backward ops to `ir.Scatter`: the input's gradient starts at zero and
each output point adds its gradient where its window read (max pooling: at the saved index;
average pooling: grad / divisor at every valid offset of the window).

Windows overlap, so the output's spatial dims (and window offsets) run in order, adding in eager's
order; batch and channel dims run in parallel.
"""
import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.ir import cast, const, index_expr
from kiln.compiler.lowering_base import Fallback, calc_dtype, check_real, op, register
from kiln.compiler.lowerings_pooling import adaptive_window, avg_pool_of, i64
from kiln.compiler.lowerings_scan import sequential_buffer

aten = torch.ops.aten
I64 = torch.int64


def gradient_scatter(ctx, x, source, target, value, serial):
    """A zero tensor like x with value(q) added at target(q) for each point q of `source`."""
    dtype = ctx.out_meta().dtype
    check_real(x)
    if dtype in ir.HALF_DTYPES or not dtype.is_floating_point:
        raise Fallback("pooling backward of a half or non-float dtype")
    zero = const(0, dtype)
    data = ir.Scatter(tuple(x.sizes), lambda idx: zero, tuple(source), target,
                      lambda q: cast(value(q), dtype), "sum", True, tuple(serial))
    return sequential_buffer(ctx, x.sizes, dtype, data)


def max_pool_backward_of(ctx, grad, x, indices):
    """Each output point's gradient added at its saved index (flat over the spatial dims)."""
    three_d = ctx.current_node.target in (aten.max_pool3d_with_indices_backward.default,
                                          aten.adaptive_max_pool3d_backward.default)
    n = 3 if three_d else 2
    batch = x.ndim - n
    extents = x.sizes[batch:]

    def target(q):
        flat = cast(indices.loader(q), I64)
        out, plane = list(q[:batch]), ir.sympy_product(extents)
        for extent in extents:
            plane = plane / extent
            out.append(op("remainder", op("floordiv", flat, i64(plane)), i64(extent)))
        return tuple(out)
    return gradient_scatter(ctx, x, grad.sizes, target, lambda q: grad.loader(q), range(batch, grad.ndim))


@register(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def max_pool_backward(ctx, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return max_pool_backward_of(ctx, grad, x, indices)


@register(aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool_backward(ctx, grad, x, indices):
    return max_pool_backward_of(ctx, grad, x, indices)


def window_scatter(ctx, grad, x, window, share):
    """share(idx) (an Expr) added at every valid position of output idx's window."""
    batch, n = window.batch, len(window.dims)
    source = tuple(grad.sizes) + tuple(w.size for w in window.dims)

    def split(q):
        return tuple(q[:grad.ndim]), tuple(q[grad.ndim:])

    def target(q):
        idx, ridx = split(q)
        out = list(idx[:batch])
        for w, o, j in zip(window.dims, idx[batch:], ridx):
            start = w.start(o)
            if start.op == "index":  # clamped: an offset in the padding adds 0 to an element in range
                out.append(sympy.Min(sympy.Max(start.args[0] + j * w.step, 0), w.extent - 1))
            else:
                out.append(op("minimum", op("add", start, index_expr(j * w.step)), i64(w.extent - 1)))
        return tuple(out)

    def value(q):
        idx, ridx = split(q)
        _, valid = window.positions(idx, ridx)
        v = share(idx)
        return v if valid is None else op("where", valid, v, const(0, v.dtype))
    return gradient_scatter(ctx, x, source, target, value, range(batch, batch + 2 * n))


@register(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def avg_pool_backward(ctx, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    n = 2 if ctx.current_node.target == aten.avg_pool2d_backward.default else 3
    pool = avg_pool_of(ctx, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n)
    compute = calc_dtype(grad.dtype)

    def share(idx):
        return op("truediv", cast(grad.loader(idx), compute), cast(pool.divisor(idx), compute))
    return window_scatter(ctx, grad, x, pool.window, share)


@register(aten._adaptive_avg_pool2d_backward.default, aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool_backward(ctx, grad, x):
    n = 2 if ctx.current_node.target == aten._adaptive_avg_pool2d_backward.default else 3
    window = adaptive_window(x, grad.sizes, n)
    compute = calc_dtype(grad.dtype)

    def share(idx):
        return op("truediv", cast(grad.loader(idx), compute), cast(window.count(idx), compute))
    return window_scatter(ctx, grad, x, window, share)
