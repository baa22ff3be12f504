"""What every aten -> IR lowering module shares: the `LOWERINGS` table and `register`, `Fallback`,
the context a lowering may ask things of, and the helpers that build pointwise values (broadcast,
dtype rules, scalar constants).

A lowering receives the lowering context (see `LoweringContext`), then the node's arguments with
tensors replaced by TensorValues. Result sizes and dtypes come from the node's fake tensor
(`ctx.out_meta()`), which is eager's own answer, so promotion and broadcasting match eager by
construction. A lowering that meets a case it does not handle raises `Fallback`; the op then
runs through aten. The lowerings themselves live in `lowerings*.py` and register on import.
"""
import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.ir import Expr, TensorValue, cast, const, index_expr

aten = torch.ops.aten
prims = torch.ops.prims
LOWERINGS = {}
ZERO, ONE = sympy.Integer(0), sympy.Integer(1)


class Fallback(Exception):
    """A lowering declines this case: the op runs through aten instead."""


class LoweringContext:
    """What lowerings may ask of the graph being lowered (GraphLowering implements it)."""

    def realize(self, value, layout=None):
        raise NotImplementedError

    def reduction(self, sizes, reduction_sizes, reduction_type, inner_fn, dtype):
        raise NotImplementedError

    def out_meta(self):
        raise NotImplementedError


def register(*ops):
    def decorate(fn):
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    if "out" not in name:
                        LOWERINGS[getattr(op, name)] = fn
            else:
                LOWERINGS[op] = fn
        return fn
    return decorate


def out_sizes(ctx):
    meta = ctx.out_meta()
    return tuple(ir.size_expr(s) for s in meta.shape)


def scalar(value, dtype):
    """A Python number, or a size expression (a SymInt argument), as an Expr of `dtype`."""
    if isinstance(value, sympy.Basic):
        if not value.free_symbols:
            return cast(const(int(value), torch.int64), dtype)
        # a float symbol (a SymFloat from sizes) is a double kernel argument
        return cast(index_expr(value, torch.int64 if value.is_integer else torch.float64), dtype)
    return const(value, dtype)


def calc_dtype(dtype):
    """Halves are computed in float."""
    return torch.float32 if dtype in ir.HALF_DTYPES else dtype


def promoted(a, b):
    """eager's result dtype for a binary op on a and b (TensorValues or Python scalars)."""
    def rep(x):
        if isinstance(x, TensorValue):
            return torch.empty((1,) * min(x.ndim, 1), dtype=x.dtype, device="meta")
        if isinstance(x, sympy.Basic):  # a size expression is an int, a float symbol a float
            return 1 if x.is_integer else 1.0
        return x
    return torch.result_type(rep(a), rep(b))


def broadcast(x, sizes, dtype):
    """index -> Expr of `x` (TensorValue or scalar) broadcast to `sizes`, converted to `dtype`."""
    if not isinstance(x, TensorValue):
        value = scalar(x, dtype)
        return lambda idx: value
    n, k = len(sizes), x.ndim

    def load(idx):
        sub = tuple(ZERO if (s == 1 and o != 1) else i for i, s, o in zip(idx[n - k:], x.sizes, sizes[n - k:]))
        return cast(x.loader(sub), dtype)
    return load


def pointwise(ctx, fn, *args, compute=None):
    """The elementwise `fn` over broadcast args: args are converted to `compute` (default: the
    result dtype, halves in float), fn builds the Expr, the result is converted to the out dtype."""
    meta = ctx.out_meta()
    dtype, sizes = meta.dtype, out_sizes(ctx)
    compute = calc_dtype(compute or dtype)
    loaders = [broadcast(a, sizes, compute) for a in args]
    return TensorValue(sizes, dtype, lambda idx: cast(fn(*(l(idx) for l in loaders)), dtype))


def op(name, *args, dtype=None):
    """An Expr; its dtype defaults to the operands' (where: the selected values')."""
    return Expr(name, args, dtype or (args[1].dtype if name == "where" else args[0].dtype))


def check_real(*values):
    for v in values:
        if isinstance(v, TensorValue) and (v.dtype.is_complex or v.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)):
            raise Fallback("complex or float8")
        if isinstance(v, complex):
            raise Fallback("complex scalar")


def norm_dim(d, ndim):
    return d + max(ndim, 1) if d < 0 else d
