"""Lowerings of cumulative scans (cumsum, cumprod, logcumsumexp, cummax, cummin) to `ir.Scan`.

A scan reads its input through the input's loader, so pointwise producers are computed inside
the scan's loop; the scan itself is a buffer of its own. Accumulation follows eager's CPU kernels
(at::acc_type): float and double accumulate in double, halves in float, integers in int64.
"""
import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.ir import TensorValue, cast
from kiln.compiler.lowering_base import Fallback, calc_dtype, check_real, norm_dim, register

aten = torch.ops.aten
ZERO = sympy.Integer(0)


def sequential_buffer(ctx, sizes, dtype, data):
    """A contiguous buffer computed by `data` (an ir.Scan or ir.Scatter); returns its value."""
    layout = ir.Layout(tuple(sizes), ir.contiguous_strides(sizes), dtype)
    buf = ctx.add_buffer(ir.ComputedBuffer(ctx.new_name(), layout, data))
    return ir.view_value(buf.name, buf.layout)


def scan_acc_dtype(dtype):
    if dtype.is_floating_point:
        return torch.float32 if dtype in ir.HALF_DTYPES else torch.float64
    return torch.int64


def scan(ctx, x, dim, scan_type, out_dtype, acc_dtype):
    """The `scan_type` scan of x along `dim` as a value of `out_dtype` (x's elements converted to
    out_dtype first, as eager converts its input)."""
    check_real(x)
    if x.ndim == 0:  # a 0-d scan is the one element: scan a 1-element row
        row = TensorValue((sympy.Integer(1),), x.dtype, lambda idx: x.loader(()))
        out = scan(ctx, row, 0, scan_type, out_dtype, acc_dtype)
        return TensorValue((), out.dtype, lambda idx: out.loader((ZERO,)))
    dim = norm_dim(dim, x.ndim)
    value_dtype = calc_dtype(out_dtype if scan_type not in ("argmax", "argmin") else x.dtype)
    result_dtype = torch.int64 if scan_type in ("argmax", "argmin") else out_dtype
    data = ir.Scan(tuple(x.sizes), dim, scan_type, lambda idx: cast(x.loader(idx), value_dtype), acc_dtype)
    return sequential_buffer(ctx, x.sizes, result_dtype, data)


@register(aten.cumsum.default, aten.cumprod.default)
def cumsum(ctx, x, dim, dtype=None):
    out_dtype = ctx.out_meta().dtype
    kind = "sum" if ctx.current_node.target == aten.cumsum.default else "prod"
    return scan(ctx, x, dim, kind, out_dtype, scan_acc_dtype(out_dtype))


@register(aten.logcumsumexp.default)
def logcumsumexp(ctx, x, dim):
    out_dtype = ctx.out_meta().dtype
    if not out_dtype.is_floating_point:
        raise Fallback("logcumsumexp of a non-float dtype")
    return scan(ctx, x, dim, "logsumexp", out_dtype, scan_acc_dtype(out_dtype))


@register(aten.cummax.default, aten.cummin.default)
def cummax(ctx, x, dim):
    kind = "max" if ctx.current_node.target == aten.cummax.default else "min"
    acc = calc_dtype(x.dtype)
    return (scan(ctx, x, dim, kind, x.dtype, acc), scan(ctx, x, dim, "arg" + kind, x.dtype, acc))
