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

    facts = None  # a SizeFacts: what the guards proved about the graph's symbolic sizes

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


def sym_layout(t):
    """The Layout of a (fake) tensor; no offset: kernels and views start at the tensor's data_ptr(),
    which includes it."""
    return ir.Layout(tuple(ir.size_expr(s) for s in t.shape), tuple(ir.size_expr(s) for s in t.stride()), t.dtype,
                     device=t.device)


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


def kernel_operands(common, args, exact=()):
    """`args` as eager's TensorIterator hands them to a kernel whose common dtype is `common`: every
    operand is first converted to it, so with a half common dtype a Python number is rounded
    (`bf16 <= 2.7` compares against 2.703125), and so is a 0-dim float32 tensor or an int tensor,
    before the kernel computes in float. Positions in `exact` are the ones whose one-element operand
    the kernel reads at full precision instead (mul's and div's second operand: eager's
    `original_scalar_value`)."""
    if common not in ir.HALF_DTYPES:
        return args
    return tuple(a if i in exact and one_element(a) else _narrowed(a, common) for i, a in enumerate(args))


def one_element(x):
    """A Python number, or a tensor value of one element broadcast (eager's `is_scalar` operand)."""
    return not isinstance(x, TensorValue) or all(s == 1 for s in x.sizes)


def _narrowed(x, dtype):
    if isinstance(x, TensorValue):
        if x.dtype == dtype:
            return x
        return TensorValue(x.sizes, dtype, lambda idx: cast(x.loader(idx), dtype))
    if isinstance(x, sympy.Basic):  # a size known only when the kernel runs
        return TensorValue((), dtype, lambda idx: scalar(x, dtype))
    if isinstance(x, (bool, int, float)):
        return float(torch.tensor(x, dtype=dtype))
    return x


def broadcast_map(ctx, in_sizes, out_sizes):
    """index map: out index -> the index into a value of `in_sizes` broadcast to `out_sizes`
    (trailing dims aligned). A dim broadcasts when its size is 1; a symbolic size that differs
    from the out size must be proven 1 or proven equal by the guards (`ir.size_expr` already turns
    sizes the guards pin into numbers), never assumed: else Fallback, raised here, not later
    inside a loader."""
    n, k = len(out_sizes), len(in_sizes)
    keep = []
    for s, o in zip(in_sizes, out_sizes[n - k:]):
        if s == o:
            keep.append(True)
        elif s == 1 or ctx.facts.equal(s, 1):
            keep.append(False)
        elif ctx.facts.equal(s, o):
            keep.append(True)
        else:
            raise Fallback(f"size {s} broadcast to {o}: the guards prove neither {s} == 1 nor {s} == {o}")
    return lambda idx: tuple(i if kept else ZERO for i, kept in zip(idx[n - k:], keep))


# a lazy value broadcast over at least BROADCAST_REUSE times its own elements is computed once into a
# buffer of its own when it costs more than REALIZE_BROADCAST_COST (ir.Expr.cost), not again for each
# element it is broadcast to: eval batch norm's weight / sqrt(var + eps) per channel, not per pixel,
# and its shift bias - mean * scale (3 ops: at 4 it stayed per pixel, ~13% of EfficientNet-B0's
# BN + SiLU kernels' time)
BROADCAST_REUSE = 16
REALIZE_BROADCAST_COST = 2


def broadcast(ctx, x, sizes, dtype):
    """index -> Expr of `x` (TensorValue or scalar) broadcast to `sizes`, converted to `dtype`."""
    if not isinstance(x, TensorValue):
        value = scalar(x, dtype)
        return lambda idx: value
    if _costly_to_recompute(x, sizes):
        x = ctx.realize(x)
    index_map = broadcast_map(ctx, x.sizes, sizes)
    return lambda idx: cast(x.loader(index_map(idx)), dtype)


def _costly_to_recompute(x, sizes):
    """Whether lazy `x` broadcast to `sizes` is worth a buffer of its own (see BROADCAST_REUSE)."""
    if x.view is not None:
        return False
    own, out = ir.sympy_product(x.sizes), ir.sympy_product(sizes)
    if not (own.is_number and out.is_number) or out < BROADCAST_REUSE * max(own, 1):
        return False
    index = tuple(sympy.Symbol(f"i{k}", integer=True, nonnegative=True) for k in range(x.ndim))
    return x.loader(index).cost() > REALIZE_BROADCAST_COST


def pointwise(ctx, fn, *args, compute=None):
    """The elementwise `fn` over broadcast args: args are converted to `compute` (default: the
    result dtype, halves in float), fn builds the Expr, the result is converted to the out dtype."""
    meta = ctx.out_meta()
    dtype, sizes = meta.dtype, out_sizes(ctx)
    compute = calc_dtype(compute or dtype)
    loaders = [broadcast(ctx, a, sizes, compute) for a in args]
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


def index_checker(ctx, size, what, wraps=False):
    """value -> an index symbol for the int64 `value` read from a tensor into a dim of `size`.
    The kernel checks the value when it runs (eager raises on an out-of-range index, and a kernel
    must never read outside its tensor): out of range, it raises KernelIndexError naming `what`.
    With `wraps`, negative values count from the end (indexing; not gather or index_select). A dim
    the guards do not prove non-empty declines here (there would be no element to read instead)."""
    if not ctx.facts.known(sympy.Ge(size, 1)):
        raise Fallback(f"{what}: the dim may be empty")
    bound = index_expr(size)
    return lambda value: ir.indirect(Expr("check_index", (cast(value, torch.int64), bound, what, wraps), torch.int64))
