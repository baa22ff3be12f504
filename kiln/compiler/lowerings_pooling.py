"""Lowerings of pooling (max/avg with fixed windows, adaptive avg/max; 2-d and 3-d, which 1-d
pooling reaches through unsqueeze) to Reductions over the window.

Each output point reduces over every offset of its window; offsets that fall in the padding (or,
for adaptive windows, past the window's end) load a clamped in-range element and are masked to
the reduction's identity. Adaptive windows vary in size (start = floor(o*in/out), end =
ceil((o+1)*in/out)): the loop covers the largest and masks the rest; when in % out == 0 they are
one fixed window. Max pooling's indices follow eager's CPU kernel: the first value above all
earlier ones, any NaN taking over, and the window's first valid position when no value beats -inf.
A window of a few offsets (3x3) is unrolled into one pointwise expression instead of a reduction
loop, so the loop over output points vectorizes and fuses like any pointwise op.
"""
import dataclasses
import functools
import itertools
import types
from typing import Callable, Optional

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.ir import TensorValue, cast, const, index_expr
from kiln.compiler.lowering_base import Fallback, calc_dtype, check_real, op, out_sizes, register

aten = torch.ops.aten
ZERO, ONE = sympy.Integer(0), sympy.Integer(1)
I64 = torch.int64
# windows of up to this many offsets become one pointwise expression (see window_reduce)
UNROLL_WINDOW = 16


@dataclasses.dataclass
class WindowDim:
    """One spatial dim of a pooling window: output o reads input positions start(o) + j*step for
    j < size, the valid ones being those in [0, extent) and, for an adaptive window, before end(o)."""
    extent: sympy.Expr               # the input's size along this dim
    size: sympy.Expr                 # offsets per window (for adaptive windows, the most)
    step: sympy.Expr                 # dilation
    start: Callable                  # o -> the first position, an int64 Expr
    padded: bool                     # whether positions may fall outside [0, extent)
    end: Optional[Callable] = None   # o -> exclusive end (int64 Expr) of an adaptive window

    def start_index(self, o):
        """start(o) as a sympy index (an indirect symbol when it is computed from o by division)."""
        e = self.start(o)
        return e.args[0] if e.op == "index" else ir.indirect(e)


def i64(value):
    value = sympy.sympify(value)
    return const(int(value), I64) if value.is_number else index_expr(value)


def both(a, b):
    return b if a is None else op("logical_and", a, b, dtype=torch.bool)


def fixed_dim(extent, kernel, stride, pad, dilation):
    return WindowDim(extent, sympy.Integer(reachable_offsets(extent, kernel, pad, dilation)), sympy.Integer(dilation),
                     lambda o: index_expr(o * stride - pad), padded=pad > 0)


def reachable_offsets(extent, kernel, pad, dilation):
    """The offsets of a window that can land in the input. A window starts at -pad or later, so
    offset j reads position >= extent (always masked) once j*dilation > extent - 1 + pad: a window
    larger than the input (HF EfficientNet pools with kernel 2560 over 1x1) loops over the input,
    not over kernel**2 masked offsets."""
    if not extent.is_number:
        return kernel
    return min(kernel, (int(extent) - 1 + pad) // dilation + 1)


def adaptive_dim(extent, out):
    if extent.is_number and out.is_number and int(extent) % int(out) == 0:
        k = extent // out
        return WindowDim(extent, k, ONE, lambda o: index_expr(o * k), padded=False)
    if not (extent.is_number and out.is_number):
        raise Fallback("adaptive pooling over a symbolic size")
    size = -(-int(extent) // int(out)) + 1  # ceil(in/out) + 1 offsets cover every window
    return WindowDim(extent, sympy.Integer(size), ONE,
                     lambda o: op("floordiv", index_expr(o * extent), i64(out)),
                     padded=False,
                     end=lambda o: op("floordiv", index_expr((o + 1) * extent + out - 1), i64(out)))


class Window:
    """The pooling window of every output point over the last len(dims) dims of x."""

    def __init__(self, x, dims):
        self.x, self.dims = x, dims
        self.batch = x.ndim - len(dims)

    def sizes(self):
        return [w.size for w in self.dims]

    def count(self, idx):
        """The number of positions in output idx's window (int64 Expr): adaptive pooling's divisor."""
        count = None
        for w, o in zip(self.dims, idx[self.batch:]):
            length = op("sub", w.end(o), w.start(o)) if w.end is not None else i64(w.size)
            count = length if count is None else op("mul", count, length)
        return count

    def unrollable(self):
        size = ir.sympy_product(self.sizes())
        return size.is_number and size <= UNROLL_WINDOW

    def positions(self, idx, ridx):
        """(sympy input index, validity Expr or None) of window offset ridx of output idx."""
        local, valid = list(idx[:self.batch]), None
        for w, o, j in zip(self.dims, idx[self.batch:], ridx):
            pos = w.start_index(o) + j * w.step
            if w.padded:
                local.append(sympy.Min(sympy.Max(pos, 0), w.extent - 1))
                p = index_expr(pos)
                valid = both(valid, op("ge", p, const(0, I64), dtype=torch.bool))
                valid = both(valid, op("lt", p, i64(w.extent), dtype=torch.bool))
            elif w.end is not None:
                local.append(sympy.Min(pos, w.extent - 1))
                valid = both(valid, op("lt", index_expr(j), op("sub", w.end(o), w.start(o)), dtype=torch.bool))
            else:
                local.append(pos)
        return tuple(local), valid

    def clamps_into_window(self):
        """Whether a padded offset's clamped position is itself in the window (no dilation, padding at
        most half the window: eager's limits for max pooling): a max then needs no mask, as the
        clamped element is one the window reads anyway."""
        return all(w.end is None and w.step == 1 for w in self.dims)

    def clamped(self, idx, ridx, dtype):
        local, _ = self.positions(idx, ridx)
        return cast(self.x.loader(local), dtype)

    def masked(self, idx, ridx, fill, dtype):
        """x at the window offset in `dtype`, `fill` where the offset is not a valid position."""
        local, valid = self.positions(idx, ridx)
        value = cast(self.x.loader(local), dtype)
        return value if valid is None else op("where", valid, value, const(fill, dtype))


def spatial(values, n):
    """An int or list parameter as n per-dim ints (a 1-element list repeats)."""
    values = [values] if isinstance(values, int) else list(values)
    if any(not isinstance(v, int) for v in values):
        raise Fallback("symbolic pooling parameters")
    return values * n if len(values) == 1 else values


def pool_params(x, n, kernel_size, stride, padding, dilation):
    if x.ndim not in (n + 1, n + 2):
        raise Fallback("pooling input of unexpected rank")
    kernel = spatial(kernel_size, n)
    stride = spatial(stride, n) if stride else kernel
    return kernel, stride, spatial(padding, n), spatial(dilation, n)


def lowest(dtype):
    if dtype.is_floating_point:
        return float("-inf")
    if dtype == torch.bool:
        raise Fallback("max pooling of bool")
    return torch.iinfo(dtype).min


# ---- max pooling ---------------------------------------------------------------------------------

def window_reduce(ctx, sizes, window, kind, fill, compute, dtype):
    """The `kind` reduction ("sum", "max", "window_argmax") of each output's window, masked
    offsets reading `fill`. A small window is unrolled into one pointwise expression, whose loop
    over output points vectorizes; a reduction loop would vectorize over the few offsets."""
    def value(idx, ridx):
        if kind == "max" and window.clamps_into_window():  # no masks: loops over channels vectorize
            return window.clamped(idx, ridx, compute)
        return window.masked(idx, ridx, fill, compute)
    if not window.unrollable():
        return ctx.reduction(sizes, window.sizes(), kind, value, dtype)
    offsets = list(itertools.product(*(range(int(w.size)) for w in window.dims)))

    def unrolled(idx):
        values = [value(idx, tuple(sympy.Integer(j) for j in ridx)) for ridx in offsets]
        if kind == "sum":
            return functools.reduce(lambda a, b: op("add", a, b), values)
        if kind == "max":
            return functools.reduce(lambda a, b: op("maximum", a, b), values)
        best, at = const(fill, compute), const(-1, I64)  # window_argmax: eager's update, offset by offset
        for j, v in enumerate(values):
            takes = op("logical_or", op("gt", v, best, dtype=torch.bool), op("ne", v, v, dtype=torch.bool),
                       dtype=torch.bool)
            best, at = op("where", takes, v, best), op("where", takes, const(j, I64), at)
        return at
    return TensorValue(sizes, dtype, unrolled)


def max_pool(ctx, x, window, dtype):
    """(values, indices) of max pooling over `window`: two reductions over the same loads."""
    compute = calc_dtype(x.dtype)
    fill = lowest(compute)
    sizes = meta_sizes(ctx.out_meta()[0])
    values = window_reduce(ctx, sizes, window, "max", fill, compute, compute)
    best = window_reduce(ctx, sizes, window, "window_argmax", fill, compute, I64)
    out = TensorValue(values.sizes, dtype, lambda idx: cast(values.loader(idx), dtype))
    return out, TensorValue(sizes, I64, lambda idx: input_position(window, idx, best.loader(idx)))


def input_position(window, idx, offset):
    """The flat spatial input index of window offset `offset` (-1: the first valid position)."""
    dims = window.dims
    flat_taken, flat_first = const(0, I64), const(0, I64)
    after = ONE
    for k, w, o in reversed(list(zip(range(len(dims)), dims, idx[window.batch:]))):
        j = op("remainder", op("floordiv", offset, i64(after)), i64(w.size))
        start = w.start(o)
        first = start
        if w.padded:  # eager steps the start past the padding by whole dilations
            skip = op("floordiv", op("add", op("neg", start), i64(w.step - 1)), i64(w.step))
            first = op("where", op("lt", start, const(0, I64), dtype=torch.bool),
                       op("add", start, op("mul", skip, i64(w.step))), start)
        plane = ir.sympy_product(d.extent for d in dims[k + 1:])
        flat_taken = op("add", flat_taken, op("mul", op("add", start, op("mul", j, i64(w.step))), i64(plane)))
        flat_first = op("add", flat_first, op("mul", first, i64(plane)))
        after = after * w.size
    return op("where", op("lt", offset, const(0, I64), dtype=torch.bool), flat_first, flat_taken)


@register(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def max_pool_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    check_real(x)
    n = 2 if ctx.current_node.target == aten.max_pool2d_with_indices.default else 3
    kernel, stride, padding, dilation = pool_params(x, n, kernel_size, stride, padding, dilation)
    dims = [fixed_dim(x.sizes[x.ndim - n + d], kernel[d], stride[d], padding[d], dilation[d]) for d in range(n)]
    if ceil_mode:  # the last window may reach past the input
        for w in dims:
            w.padded = True
    return max_pool(ctx, x, Window(x, dims), ctx.out_meta()[0].dtype)


@register(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(ctx, x, output_size):
    check_real(x)
    window = adaptive_window(x, meta_sizes(ctx.out_meta()[0]), len(output_size))
    return max_pool(ctx, x, window, ctx.out_meta()[0].dtype)


def meta_sizes(meta):
    """The sizes of one fake tensor of a multi-output node, as `out_sizes` reads a single one."""
    return out_sizes(types.SimpleNamespace(out_meta=lambda: meta))


# ---- average pooling ------------------------------------------------------------------------------

def window_sum(ctx, window, dtype):
    return window_reduce(ctx, out_sizes(ctx), window, "sum", 0, dtype, dtype)


def divided(total, divisor_of, out_dtype):
    """total / divisor_of(idx) per point: true division for floats, truncation for integers (eager)."""
    compute = calc_dtype(out_dtype)
    name = "truediv" if compute.is_floating_point else "truncdiv"
    return TensorValue(total.sizes, out_dtype,
                       lambda idx: cast(op(name, total.loader(idx), cast(divisor_of(idx), compute)), out_dtype))


@dataclasses.dataclass
class AvgPool:
    """avg_pool's window and divisor (shared by its backward)."""
    window: Window
    kernel: list
    stride: list
    padding: list
    count_include_pad: bool
    divisor_override: Optional[int]

    def divisor(self, idx):
        """The int64 divisor of output point idx, as eager's kernel computes it."""
        if self.divisor_override:
            return const(int(self.divisor_override), I64)
        count = ONE
        for d, (w, o) in enumerate(zip(self.window.dims, idx[self.window.batch:])):
            start = o * self.stride[d] - self.padding[d]
            end = sympy.Min(start + self.kernel[d], w.extent + self.padding[d])  # eager's window, padding included
            if not self.count_include_pad:
                start, end = sympy.Max(start, 0), sympy.Min(end, w.extent)
            count = count * (end - start)
        return index_expr(count)


def avg_pool_of(ctx, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    kernel, stride, padding, _ = pool_params(x, n, kernel_size, stride, padding, 1)
    dims = [fixed_dim(x.sizes[x.ndim - n + d], kernel[d], stride[d], padding[d], 1) for d in range(n)]
    for w in dims:
        w.padded = w.padded or ceil_mode
    return AvgPool(Window(x, dims), kernel, stride, padding, count_include_pad, divisor_override)


@register(aten.avg_pool2d.default, aten.avg_pool3d.default)
def avg_pool(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    check_real(x)
    n = 2 if ctx.current_node.target == aten.avg_pool2d.default else 3
    pool = avg_pool_of(ctx, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n)
    out_dtype = ctx.out_meta().dtype
    total = window_sum(ctx, pool.window, calc_dtype(out_dtype))
    return divided(total, pool.divisor, out_dtype)


def adaptive_window(x, out_sizes, n):
    """The adaptive windows of outputs of `out_sizes` over the last n dims of x."""
    return Window(x, [adaptive_dim(x.sizes[x.ndim - n + d], out_sizes[len(out_sizes) - n + d]) for d in range(n)])


@register(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(ctx, x, output_size):
    check_real(x)
    window = adaptive_window(x, out_sizes(ctx), len(output_size))
    out_dtype = ctx.out_meta().dtype
    total = window_sum(ctx, window, calc_dtype(out_dtype))
    return divided(total, window.count, out_dtype)
