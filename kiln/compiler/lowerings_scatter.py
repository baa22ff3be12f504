"""Lowerings of scatter-style ops (scatter, scatter_add, scatter_reduce, index_put; index_add,
index_copy and index_fill reach lowering as index_put) to `ir.Scatter`.

The output starts as a copy of self, then each source point stores or combines its value at a
position read from an index tensor. Two source points can hit the same element only when they
differ along the scattered dims (scatter: `dim`; index_put: the index tensors' broadcast dims),
so those run in order, last write winning as in eager's CPU kernels, and the rest in parallel.
Indices out of range raise when the kernel runs (index_put counts negative indices from the
end, scatter does not), as eager does.
"""
import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.ir import TensorValue, cast, const
from kiln.compiler.lowerings import Fallback, broadcast, check_real, norm_dim, op, register
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


def scatter_along(ctx, x, dim, index, value_fn, mode, include_self=True, init_fn=None):
    """x with value_fn(q) combined (mode) at x[q with q[dim] replaced by index[q]], for each index point q."""
    check_target(x)
    if index.ndim != x.ndim:
        raise Fallback("scatter with an index of another rank")
    dim = norm_dim(dim, x.ndim)

    def target(q):
        return tuple(cast(index.loader(q), I64) if d == dim else q[d] for d in range(x.ndim))
    data = ir.Scatter(tuple(x.sizes), init_fn or (lambda idx: x.loader(idx)), tuple(index.sizes), target,
                      value_fn, mode, include_self, (dim,))
    return sequential_buffer(ctx, x.sizes, x.dtype, data)


@register(aten.scatter.src, aten.scatter.value, aten.scatter_add.default, aten.scatter.reduce,
          aten.scatter.value_reduce)
def scatter(ctx, x, dim, index, src, reduce=None):
    target = ctx.current_node.target
    mode = "sum" if target == aten.scatter_add.default else (REDUCE_MODES[reduce] if reduce else None)
    return scatter_along(ctx, x, dim, index, scatter_value(src, x.dtype), mode)


@register(aten.scatter_reduce.two)
def scatter_reduce(ctx, x, dim, index, src, reduce, include_self=True):
    if reduce not in REDUCE_MODES:
        raise Fallback(f"scatter_reduce {reduce}")
    out = scatter_along(ctx, x, dim, index, scatter_value(src, x.dtype), REDUCE_MODES[reduce], include_self)
    if reduce != "mean":
        return out
    # eager: count the values each element got (self counting once if included), 0 counts as 1
    start = const(1 if include_self else 0, x.dtype)
    count = scatter_along(ctx, x, dim, index, lambda q: const(1, x.dtype), "sum", init_fn=lambda idx: start)
    name = "truediv" if x.dtype.is_floating_point else "floordiv"

    def fn(idx):
        n = count.loader(idx)
        n = op("where", op("eq", n, const(0, x.dtype), dtype=torch.bool), const(1, x.dtype), n)
        return op(name, out.loader(idx), n)
    return TensorValue(x.sizes, x.dtype, fn)


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


@register(aten.index_put.default)
def index_put(ctx, x, indices, values, accumulate=False):
    check_target(x)
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
    load_value = broadcast(values, source, x.dtype)

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
