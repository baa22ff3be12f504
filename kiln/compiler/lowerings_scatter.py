"""Lowerings of scatter-style ops (scatter, scatter_add, scatter_reduce, index_put; index_add,
index_copy and index_fill reach lowering as index_put) to `ir.Scatter`.

The output starts as a copy of self, then each source point stores or combines its value at a
position read from an index tensor. Two source points can hit the same element only when they
differ along the scattered dims (scatter: `dim`; index_put: the index tensors' broadcast dims),
so those run in order, last write winning as in eager's CPU kernels, and the rest in parallel.
Indices out of range raise when the kernel runs (index_put counts negative indices from the
end, scatter does not), as eager does.
"""
import dataclasses
import functools
from typing import Callable

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.ir import TensorValue, cast, const
from kiln.compiler.lowering_base import Fallback, broadcast, check_real, norm_dim, op, register
from kiln.compiler.lowerings_scan import sequential_buffer

aten = torch.ops.aten
ZERO, ONE = sympy.Integer(0), sympy.Integer(1)
I64 = torch.int64
REDUCE_MODES = {"sum": "sum", "add": "sum", "prod": "prod", "multiply": "prod", "amax": "max", "amin": "min",
                "mean": "sum"}


def check_target(x):
    check_real(x)
    if x.dtype in ir.HALF_DTYPES:
        raise Fallback("scatter into a half dtype")
    if x.ndim == 0:
        raise Fallback("scatter into a 0-d tensor")


def scatter_value(src, dtype):
    """source index -> the value scattered (a tensor's element or a scalar), in `dtype`."""
    if isinstance(src, TensorValue):
        return lambda q: cast(src.loader(q), dtype)
    value = const(src, dtype)
    return lambda q: value


@dataclasses.dataclass
class AlongDim:
    """A scatter along one dim: source point q lands at q with q[dim] replaced by pick(q)."""
    dim: int
    source_sizes: tuple
    pick: Callable  # source index -> the int64 position along dim

    def scatter(self, ctx, x, value_fn, mode, include_self=True, init_fn=None):
        """x with value_fn(q) combined (mode) at the target of each source point q."""
        def target(q):
            return tuple(cast(self.pick(q), I64) if d == self.dim else q[d] for d in range(x.ndim))
        data = ir.Scatter(tuple(x.sizes), init_fn or (lambda idx: x.loader(idx)), tuple(self.source_sizes), target,
                          value_fn, mode, include_self, (self.dim,))
        return sequential_buffer(ctx, x.sizes, x.dtype, data)

    def reduce(self, ctx, x, value_fn, reduce, include_self):
        """scatter_reduce / index_reduce: `reduce` is sum, prod, mean, amax or amin."""
        if reduce not in REDUCE_MODES:
            raise Fallback(f"reduce {reduce}")
        out = self.scatter(ctx, x, value_fn, REDUCE_MODES[reduce], include_self)
        if reduce != "mean":
            return out
        # eager: count the values each element got (self counting once if included), 0 counts as 1
        start = const(1 if include_self else 0, x.dtype)
        count = self.scatter(ctx, x, lambda q: const(1, x.dtype), "sum", init_fn=lambda idx: start)
        name = "truediv" if x.dtype.is_floating_point else "floordiv"

        def fn(idx):
            n = count.loader(idx)
            n = op("where", op("eq", n, const(0, x.dtype), dtype=torch.bool), const(1, x.dtype), n)
            return op(name, out.loader(idx), n)
        return TensorValue(x.sizes, x.dtype, fn)


def scatter_dim(x, dim, index):
    """scatter's placement: index has x's rank, each of its points names a position along dim."""
    check_target(x)
    if index.ndim != x.ndim:
        raise Fallback("scatter with an index of another rank")
    return AlongDim(norm_dim(dim, x.ndim), tuple(index.sizes), index.loader)


def one_element_row(v):
    """A 0-d tensor value as a 1-element row (anything else as it is)."""
    if not isinstance(v, TensorValue) or v.ndim:
        return v
    return TensorValue((ONE,), v.dtype, lambda idx: v.loader(()))


def zero_d_as_row(lowering):
    """`lowering(ctx, x, dim, ...)` on a 0-d x: run on 1-element rows along dim 0, result back to 0-d."""
    @functools.wraps(lowering)
    def lower(ctx, x, dim, *args, **kwargs):
        if x.ndim:
            return lowering(ctx, x, dim, *args, **kwargs)
        row = lowering(ctx, one_element_row(x), 0, *(one_element_row(a) for a in args), **kwargs)
        return TensorValue((), row.dtype, lambda idx: row.loader((ZERO,)))
    return lower


@register(aten.scatter.src, aten.scatter.value, aten.scatter_add.default, aten.scatter.reduce,
          aten.scatter.value_reduce)
@zero_d_as_row
def scatter(ctx, x, dim, index, src, reduce=None):
    target = ctx.current_node.target
    mode = "sum" if target == aten.scatter_add.default else (REDUCE_MODES[reduce] if reduce else None)
    return scatter_dim(x, dim, index).scatter(ctx, x, scatter_value(src, x.dtype), mode)


@register(aten.scatter_reduce.two)
@zero_d_as_row
def scatter_reduce(ctx, x, dim, index, src, reduce, include_self=True):
    return scatter_dim(x, dim, index).reduce(ctx, x, scatter_value(src, x.dtype), reduce, include_self)


@register(aten.index_reduce.default)
@zero_d_as_row
def index_reduce(ctx, x, dim, index, source, reduce, include_self=True):
    """source's slices along dim reduced into x at the positions index (1-d) names."""
    check_target(x)
    if index.ndim > 1 or source.ndim != x.ndim:
        raise Fallback("index_reduce of unexpected ranks")
    dim = norm_dim(dim, x.ndim)
    along = AlongDim(dim, tuple(source.sizes), lambda q: index.loader((q[dim],) if index.ndim else ()))
    return along.reduce(ctx, x, scatter_value(source, x.dtype), reduce, include_self)


def wrapped(value, size):
    """An int64 index Expr with negative values counted from the end (eager's indexing)."""
    v = cast(value, I64)
    n = const(int(size), I64) if size.is_number else ir.index_expr(size)
    return op("where", op("lt", v, const(0, I64), dtype=torch.bool), op("add", v, n), v)


def broadcast_sizes(shapes):
    """The broadcast of `shapes` (sympy sizes), as torch broadcasts."""
    n = max((len(s) for s in shapes), default=0)
    out = [ONE] * n
    for shape in shapes:
        for k, size in enumerate(shape, start=n - len(shape)):
            if size != 1:
                out[k] = size
    return tuple(out)


def masked_put(ctx, x, d, mask, values, accumulate):
    """x[..., mask, ...] = values (one boolean index at dim d) as a select: every element is hit
    at most once, so no scatter is needed, provided values do not vary along the selected
    elements (their count is known only at run time)."""
    after = len(x.sizes) - d - mask.ndim
    k = values.ndim - after - 1  # values' dim that runs along the selected elements
    if k >= 0 and values.sizes[k] != 1:
        raise Fallback("index_put with a mask and values that vary along the selected elements")
    indexed = tuple(x.sizes[:d]) + (ONE,) + tuple(x.sizes[d + mask.ndim:])
    load_value = broadcast(ctx, values, indexed, x.dtype)

    def fn(idx):
        selected = op("ne", cast(mask.loader(tuple(idx[d:d + mask.ndim])), I64), const(0, I64), dtype=torch.bool)
        v = load_value(tuple(idx[:d]) + (ZERO,) + tuple(idx[d + mask.ndim:]))
        old = x.loader(idx)
        if accumulate:
            return cast(op("add", old, op("where", selected, v, const(0, x.dtype))), x.dtype)
        return op("where", selected, v, old)
    return TensorValue(tuple(x.sizes), x.dtype, fn)


@register(aten.index_put.default)
def index_put(ctx, x, indices, values, accumulate=False):
    check_target(x)
    masks = [d for d, i in enumerate(indices) if i is not None and i.dtype in (torch.bool, torch.uint8)]
    if masks and len([i for i in indices if i is not None]) == 1:
        return masked_put(ctx, x, masks[0], indices[masks[0]], values, accumulate)
    if len(indices) > x.ndim or any(i is not None and i.dtype not in (torch.int64, torch.int32) for i in indices):
        raise Fallback("index_put with boolean or too many indices")
    indices = list(indices) + [None] * (x.ndim - len(indices))
    used = [d for d, i in enumerate(indices) if i is not None]
    if not used:
        raise Fallback("index_put without index tensors")
    shape = broadcast_sizes([indices[d].sizes for d in used])
    nb = len(shape)
    adjacent = used == list(range(used[0], used[-1] + 1))
    # eager's indexed shape: the broadcast dims replace adjacent indexed dims in place, else go first
    first = used[0] if adjacent else 0
    rest = [d for d in range(x.ndim) if d not in used]
    before = [d for d in rest if d < first] if adjacent else []
    after = [d for d in rest if d not in before]
    source = tuple(x.sizes[d] for d in before) + shape + tuple(x.sizes[d] for d in after)
    slot = {d: k for k, d in enumerate(before)}
    slot.update({d: len(before) + nb + k for k, d in enumerate(after)})
    load_value = broadcast(ctx, values, source, x.dtype)

    def target(q):
        bq = q[len(before):len(before) + nb]
        out = []
        for d in range(x.ndim):
            if d in slot:
                out.append(q[slot[d]])
                continue
            ind = indices[d]
            sub = tuple(ZERO if s == 1 else i for i, s in zip(bq[nb - ind.ndim:], ind.sizes))
            out.append(wrapped(ind.loader(sub), x.sizes[d]))
        return tuple(out)
    serial = tuple(range(len(before), len(before) + nb))
    data = ir.Scatter(tuple(x.sizes), lambda idx: x.loader(idx), source, target, load_value,
                      "sum" if accumulate else None, True, serial)
    return sequential_buffer(ctx, x.sizes, x.dtype, data)


def slice_bounds(start, end, step, size):
    """eager's slice of a dim of `size`: (start, end) clamped to [0, size], negatives from the end."""
    if not all(isinstance(v, int) for v in (start, end, step) if v is not None) or not size.is_number:
        raise Fallback("slice_scatter with symbolic bounds")
    size = int(size)
    start, end = (0 if start is None else start), (size if end is None else end)
    start, end = (start + size if start < 0 else start), (end + size if end < 0 else end)
    return min(max(start, 0), size), min(max(end, start, 0), size), step


@register(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """x with src in x[..., start:end:step, ...]: each element is hit at most once, a select."""
    check_real(x, src)
    if x.ndim == 0:
        raise Fallback("slice_scatter of a 0-d tensor")
    dim = dim + x.ndim if dim < 0 else dim
    start, end, step = slice_bounds(start, end, step, x.sizes[dim])
    if src.numel == 0:  # nothing to place (and no element of src to load)
        return x

    def fn(idx):
        i = ir.index_expr(idx[dim])
        inside = op("logical_and", op("ge", i, const(start, I64), dtype=torch.bool),
                    op("lt", i, const(end, I64), dtype=torch.bool), dtype=torch.bool)
        offset = op("sub", i, const(start, I64))
        if step != 1:
            on_step = op("eq", op("remainder", offset, const(step, I64)), const(0, I64), dtype=torch.bool)
            inside = op("logical_and", inside, on_step, dtype=torch.bool)
            position = op("floordiv", offset, const(step, I64))
            # clamped so a point outside the slice still loads in bounds (then it is not selected)
            last = ir.index_expr(sympy.Max(src.sizes[dim] - 1, 0))
            at = ir.indirect(op("minimum", op("maximum", position, const(0, I64)), last))
        else:
            at = sympy.Min(sympy.Max(idx[dim] - start, 0), sympy.Max(src.sizes[dim] - 1, 0))
        local = tuple(idx[:dim]) + (at,) + tuple(idx[dim + 1:])
        return op("where", inside, cast(src.loader(local), x.dtype), x.loader(idx))
    return TensorValue(tuple(x.sizes), x.dtype, fn)


@register(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, x, src, offset=0, dim1=0, dim2=1):
    """x with src on its diagonal (dims dim1, dim2; src's last dim runs along it): a select."""
    check_real(x, src)
    if src.numel == 0:  # an empty diagonal: nothing to place
        return x
    if not isinstance(offset, int):
        raise Fallback("diagonal_scatter with a symbolic offset")
    dim1, dim2 = norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim)
    rest = [d for d in range(x.ndim) if d not in (dim1, dim2)]
    last = sympy.Max(src.sizes[-1] - 1, 0)

    def fn(idx):
        on = op("eq", ir.index_expr(idx[dim2] - idx[dim1]), const(offset, I64), dtype=torch.bool)
        along = idx[dim1] if offset >= 0 else idx[dim2]  # the position along the diagonal
        local = tuple(idx[d] for d in rest) + (sympy.Min(along, last),)
        return op("where", on, cast(src.loader(local), x.dtype), x.loader(idx))
    return TensorValue(tuple(x.sizes), x.dtype, fn)
