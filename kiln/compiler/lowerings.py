"""aten op -> TensorValue lowerings of elementwise math, views, reductions, norms, cat and gathers
(the machinery they share is in `lowering_base`; pooling, scans and scatters have modules of
their own). Each registers itself into `LOWERINGS` on import.
"""
import math

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.ir import TensorValue, cast, const, index_expr
from kiln.compiler.lowering_base import (ONE, ZERO, Fallback, aten, broadcast, broadcast_map, calc_dtype, check_real,
                                         kernel_operands, one_element,
                                         index_checker, norm_dim, op, out_sizes, pointwise, prims, promoted, register,
                                         scalar, sym_layout)

# ---- elementwise math ----------------------------------------------------------------------

UNARY = {
    aten.abs: "abs", aten.neg: "neg", aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1",
    aten.log: "log", aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt",
    aten.rsqrt: "rsqrt", aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin",
    aten.acos: "acos", aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.erf: "erf", aten.erfc: "erfc",
    aten.sigmoid: "sigmoid", aten.reciprocal: "reciprocal", aten.floor: "floor", aten.ceil: "ceil",
    aten.round.default: "round", aten.trunc: "trunc", aten.relu: "relu", aten.bitwise_not: "bitwise_not",
    aten.sign: "sign", aten.lgamma: "lgamma",
}

# ops that are the identity on integer inputs
INTEGER_IDENTITY = {"floor", "ceil", "round", "trunc"}


def _unary(name):
    def lower(ctx, x):
        check_real(x)
        if name in INTEGER_IDENTITY and not x.dtype.is_floating_point:
            return x
        if name == "bitwise_not" and x.dtype == torch.bool:
            return pointwise(ctx, lambda a: op("logical_not", a), x)
        if name == "sign" and x.dtype == torch.bool:
            return x
        return pointwise(ctx, lambda a: op(name, a), x)
    return lower


for _target, _name in UNARY.items():
    register(_target)(_unary(_name))


@register(aten.silu)
def silu(ctx, x):
    check_real(x)
    return pointwise(ctx, lambda a: op("mul", a, op("sigmoid", a)), x)


@register(aten.gelu)
def gelu(ctx, x, approximate="none"):
    """As decompositions._gelu: forms that do not cancel for x << 0."""
    check_real(x)

    def fn(a):
        if approximate == "tanh":
            cube = op("mul", const(0.044715, a.dtype), op("mul", a, op("mul", a, a)))
            inner = op("mul", const(2 * math.sqrt(2 / math.pi), a.dtype), op("add", a, cube))
            return op("mul", a, op("sigmoid", inner))
        erfc = op("erfc", op("mul", a, const(-math.sqrt(0.5), a.dtype)))
        return op("mul", op("mul", a, const(0.5, a.dtype)), erfc)
    return pointwise(ctx, fn, x)


def _float_class_test(name):
    """isnan/isinf: a float test, constant False for integer and bool inputs (they are never nan/inf)."""
    def lower(ctx, x):
        check_real(x)
        if not x.dtype.is_floating_point:
            return pointwise(ctx, lambda a: const(False, torch.bool), x)
        return pointwise(ctx, lambda a: op(name, a, dtype=torch.bool), x, compute=x.dtype)
    return lower


register(aten.isnan)(_float_class_test("isnan"))
register(aten.isinf)(_float_class_test("isinf"))


@register(aten.logical_not)
def logical_not(ctx, x):
    check_real(x)
    return pointwise(ctx, lambda a: op("logical_not", a, dtype=torch.bool), x, compute=torch.bool)


def _with_alpha(name):
    def lower(ctx, a, b, alpha=None):
        check_real(a, b)
        common = ctx.out_meta().dtype
        a, b = kernel_operands(common, (a, b))
        if alpha is not None and alpha != 1:
            alpha = kernel_operands(common, (alpha,))[0]  # eager's add kernel rounds alpha too
            return pointwise(ctx, lambda x, y: op(name, x, op("mul", y, const(alpha, y.dtype))), a, b)
        return pointwise(ctx, lambda x, y: op(name, x, y), a, b)
    return lower


register(aten.add.Tensor, aten.add.Scalar)(_with_alpha("add"))
register(aten.sub.Tensor, aten.sub.Scalar)(_with_alpha("sub"))


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx, a, b, alpha=1):
    return _with_alpha("sub")(ctx, b, a, alpha)


BINARY = {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul",
    aten.maximum: "maximum", aten.minimum: "minimum", aten.atan2: "atan2",
    aten.bitwise_and.Tensor: "bitwise_and", aten.bitwise_or.Tensor: "bitwise_or",
    aten.bitwise_xor.Tensor: "bitwise_xor", aten.bitwise_and.Scalar: "bitwise_and",
    aten.bitwise_or.Scalar: "bitwise_or", aten.bitwise_xor.Scalar: "bitwise_xor",
    aten.remainder.Tensor: "remainder", aten.remainder.Scalar: "remainder",
    aten.fmod.Tensor: "fmod", aten.fmod.Scalar: "fmod",
}


# ops whose CPU kernel reads a one-element second operand at full precision, not rounded to a half
# common dtype (eager's mul/div kernels: `bf16 * 0.3` multiplies by 0.3f, `bf16 + 0.3` adds 0.30078125)
EXACT_SECOND_OPERAND = ("mul", "truediv", "floordiv")


def _operands(ctx, name, a, b, dtype=None):
    """a, b as the kernel `name` takes them (kernel_operands with its exact second operand)."""
    exact = (1,) if name in EXACT_SECOND_OPERAND else ()
    return kernel_operands(dtype or ctx.out_meta().dtype, (a, b), exact=exact)


def _binary(name, narrow=True):
    def lower(ctx, a, b):
        check_real(a, b)
        if narrow:
            a, b = _operands(ctx, name, a, b)
        return pointwise(ctx, lambda x, y: op(name, x, y), a, b)
    return lower


for _target, _name in BINARY.items():
    register(_target)(_binary(_name))


@register(aten.div.Tensor, aten.div.Scalar)
def div(ctx, a, b):
    check_real(a, b)
    a, b = _operands(ctx, "truediv", a, b)
    return pointwise(ctx, lambda x, y: op("truediv", x, y), a, b)


def _stepwise_floordiv(dtype):
    """x // y as eager's half kernel computes it (Vectorized<Half>'s div_floor_floating_vec): in
    float, each step rounded to `dtype`, so the quotient is rounded before it is floored (float16
    284 // 0.10638 is 2670: the quotient 2669.6 rounds up; floored first, 2669 would round to 2668)."""
    def fn(x, y):
        f = x.dtype
        def rounded(e):
            return cast(cast(e, dtype), f)
        def test(name, *args):
            return op(name, *args, dtype=torch.bool)
        zero, one = const(0.0, f), const(1.0, f)
        quotient = rounded(op("truediv", x, y))
        mod = op("fmod", x, y)  # exact: no rounding
        overflowed = test("logical_and", test("isinf", quotient), test("logical_not", test("isinf", x)))
        div = rounded(op("truediv", op("where", overflowed, x, rounded(op("sub", x, mod))), y))
        wrong_sign = test("logical_and", test("ne", mod, zero), test("logical_xor", test("lt", y, zero),
                                                                        test("lt", mod, zero)))
        div = op("where", wrong_sign, rounded(op("sub", div, one)), div)
        floor = op("floor", div)
        floor = op("where", test("gt", op("sub", div, floor), const(0.5, f)), rounded(op("add", floor, one)), floor)
        floor = op("where", test("eq", div, zero), op("mul", quotient, zero), floor)  # zero with the quotient's sign
        return op("where", test("eq", y, zero), quotient, floor)
    return fn


def _floor_quotient(ctx, a, b, dtype):
    """a // b after _operands: eager's half kernel rounds each step unless b is one element (then
    it computes in float and rounds once, like kiln's floordiv)."""
    if dtype in ir.HALF_DTYPES and not one_element(b):
        return pointwise(ctx, _stepwise_floordiv(dtype), a, b)
    return pointwise(ctx, lambda x, y: op("floordiv", x, y), a, b)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx, a, b):
    check_real(a, b)
    dtype = ctx.out_meta().dtype
    a, b = _operands(ctx, "floordiv", a, b, dtype)
    return _floor_quotient(ctx, a, b, dtype)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, a, b, rounding_mode=None):
    check_real(a, b)
    dtype = ctx.out_meta().dtype
    a, b = _operands(ctx, "truediv", a, b, dtype)  # (every rounding mode divides: eager's div kernels)
    if rounding_mode is None:
        return pointwise(ctx, lambda x, y: op("truediv", x, y), a, b)
    if rounding_mode == "floor":
        return _floor_quotient(ctx, a, b, dtype)
    if dtype.is_floating_point and dtype in ir.HALF_DTYPES and not one_element(b):
        # eager's half kernel rounds the quotient to the half dtype before truncating it
        return pointwise(ctx, lambda x, y: op("trunc", cast(cast(op("truediv", x, y), dtype), x.dtype)), a, b)
    if dtype.is_floating_point:
        return pointwise(ctx, lambda x, y: op("trunc", op("truediv", x, y)), a, b)
    return pointwise(ctx, lambda x, y: op("truncdiv", x, y), a, b)


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(ctx, a, b):
    check_real(a, b)
    dtype = ctx.out_meta().dtype
    a, b = kernel_operands(dtype, (a, b))
    if not dtype.is_floating_point:
        if isinstance(b, TensorValue) or b < 0:
            raise Fallback("integer pow with tensor or negative exponent")
        return pointwise(ctx, lambda x, y: op("ipow", x, y), a, b)
    # Small constant exponents become multiplies/sqrt, as eager's CPU kernel does
    # (pow_tensor_scalar_optimized_kernel: 2, 3, 0.5, -0.5, -1, -2): the same rounding as eager, and
    # a vector powf call costs ~15 ns/element (GELU-tanh's x**3 made its kernel 10x slower).
    if not isinstance(b, TensorValue) and b == 2:
        return pointwise(ctx, lambda x: op("mul", x, x), a)
    # eager's bfloat16 kernel computes these in bfloat16 vectors: x*x is rounded before the next step
    def step(e):
        return cast(cast(e, dtype), e.dtype) if dtype == torch.bfloat16 else e
    if not isinstance(b, TensorValue) and b == 3:
        return pointwise(ctx, lambda x: op("mul", step(op("mul", x, x)), x), a)
    # (not for float16, whose kernel calls pow: pow(-inf, 0.5) is inf, sqrt(-inf) NaN; pow(-0., 0.5) +0.)
    if not isinstance(b, TensorValue) and b == 0.5 and dtype != torch.float16:
        return pointwise(ctx, lambda x: op("sqrt", x), a)
    if not isinstance(b, TensorValue) and b == -0.5 and dtype != torch.float16:
        return pointwise(ctx, lambda x: op("rsqrt", x), a)
    if not isinstance(b, TensorValue) and b == -1:
        return pointwise(ctx, lambda x: op("reciprocal", x), a)
    if not isinstance(b, TensorValue) and b == -2:
        return pointwise(ctx, lambda x: op("reciprocal", step(op("mul", x, x))), a)
    return pointwise(ctx, lambda x, y: op("pow", x, y), a, b)


COMPARISONS = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge"}
LOGICAL = {aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor"}


def _comparison(name, logical=False):
    def lower(ctx, a, b):
        check_real(a, b)
        compute = torch.bool if logical else promoted(a, b)
        a, b = kernel_operands(compute, (a, b))
        return pointwise(ctx, lambda x, y: op(name, x, y, dtype=torch.bool), a, b, compute=compute)
    return lower


for _target, _name in COMPARISONS.items():
    register(_target)(_comparison(_name))
for _target, _name in LOGICAL.items():
    register(_target)(_comparison(_name, logical=True))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, cond, a, b):
    check_real(a, b)
    sizes, dtype = out_sizes(ctx), ctx.out_meta().dtype
    c = broadcast(ctx, cond, sizes, torch.bool)
    x, y = broadcast(ctx, a, sizes, calc_dtype(dtype)), broadcast(ctx, b, sizes, calc_dtype(dtype))
    return TensorValue(sizes, dtype, lambda idx: cast(op("where", c(idx), x(idx), y(idx)), dtype))


@register(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
          aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def clamp(ctx, x, lo=None, hi=None):
    check_real(x, lo, hi)
    target = ctx.current_node.target
    if target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    args = [a for a in (x, lo, hi) if a is not None]

    def fn(v, *bounds):
        bounds = list(bounds)
        if lo is not None:
            v = op("maximum", v, bounds.pop(0))
        if hi is not None:
            v = op("minimum", v, bounds.pop(0))
        return v
    return pointwise(ctx, fn, *args)


@register(aten.hardtanh)
def hardtanh(ctx, x, lo=-1.0, hi=1.0):
    check_real(x)
    return pointwise(ctx, lambda v: op("minimum", op("maximum", v, const(lo, v.dtype)), const(hi, v.dtype)), x)


# ---- copies, casts, constants -----------------------------------------------------------------

@register(aten._to_copy.default)
def to_copy(ctx, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    meta = ctx.out_meta()
    if x.dtype.is_complex or meta.dtype.is_complex:  # (a copy to another device never gets here: lower.py)
        raise Fallback("not a real dtype conversion")
    return pointwise(ctx, lambda a: a, x, compute=x.dtype)


@register(prims.convert_element_type.default)
def convert_element_type(ctx, x, dtype):
    check_real(x)
    return pointwise(ctx, lambda a: a, x, compute=x.dtype)


@register(aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def identity(ctx, x, memory_format=None):
    return x


CHANNELS_LAST = (torch.channels_last, torch.channels_last_3d)
# set on the clones layout_opt puts in front of convolutions
LAYOUT_CLONE = "kiln_layout_clone"


@register(aten.clone.default)
def clone(ctx, x, memory_format=None):
    """The value itself (a copy is made only where one is stored), except that a buffer cloned into
    another memory format (channels-last, or any layout_opt asks for in front of a convolution)
    becomes a lazy copy: kernels read through it, and where it is stored (an aten op's argument) it
    gets the new layout, as eager's clone does (ir.TensorValue.strides, from the node's fake value)."""
    converts = memory_format in CHANNELS_LAST or ctx.current_node.meta.get(LAYOUT_CLONE)
    if converts and x.view is not None and x.view.layout.strides != sym_layout(ctx.out_meta()).strides:
        return TensorValue(x.sizes, x.dtype, x.loader)
    return x


@register(aten.full.default, aten.scalar_tensor.default)
def full(ctx, size_or_value, fill_value=None, **kwargs):
    value = size_or_value if fill_value is None else fill_value
    meta = ctx.out_meta()
    if meta.dtype.is_complex or isinstance(value, complex):
        raise Fallback("complex constant")
    v = cast(scalar(value, calc_dtype(meta.dtype) if not isinstance(value, bool) else torch.bool), meta.dtype)
    return TensorValue(out_sizes(ctx), meta.dtype, lambda idx: v)


@register(aten.full_like.default)
def full_like(ctx, x, fill_value, **kwargs):
    return full(ctx, None, fill_value)


@register(aten.zeros_like.default, aten.ones_like.default)
def zeros_ones_like(ctx, x, **kwargs):
    return full(ctx, None, 1 if ctx.current_node.target == aten.ones_like.default else 0)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx, *args, **kwargs):
    numbers = [a for a in args if isinstance(a, (int, float, sympy.Basic))]  # sympy: a symbolic bound
    start, step = 0, 1
    if len(numbers) >= 2:
        start = numbers[0]
    if len(numbers) == 3:
        step = numbers[2]
    dtype = ctx.out_meta().dtype
    if dtype.is_complex:
        raise Fallback("complex arange")

    def fn(idx):
        i = index_expr(idx[0], torch.float64 if dtype.is_floating_point else torch.int64)
        return cast(op("add", scalar(start, i.dtype), op("mul", i, scalar(step, i.dtype))), dtype)
    return TensorValue(out_sizes(ctx), dtype, fn)


# ---- views: index maps (strided views of buffers stay strided views) --------------------------

def view_map(x, sizes, index_map):
    """The view of `x` with `sizes` whose element idx is x's element index_map(idx)."""
    sizes = tuple(sympy.Integer(s) if isinstance(s, int) else s for s in sizes)
    if x.view is not None:
        syms = [sympy.Symbol(f"v{k}", integer=True, nonnegative=True) for k in range(len(sizes))]
        flat = sympy.expand(x.view.layout.index(index_map(syms)))
        poly = flat.as_poly(*syms) if syms else None
        if not syms or (poly is not None and poly.total_degree() <= 1):
            strides = tuple(flat.coeff(s) if sz != 1 else sympy.Integer(0) for s, sz in zip(syms, sizes))
            offset = flat.xreplace({s: ZERO for s in syms})
            # torch has no negative strides: such views (flip) stay index maps
            if all(_nonnegative(st) for st in strides) and _nonnegative(offset):
                layout = ir.Layout(sizes, strides, x.dtype, offset, x.view.layout.device)
                return ir.view_value(x.view.name, layout)
    return TensorValue(sizes, x.dtype, lambda idx: x.loader(tuple(index_map(idx))))


def _nonnegative(e):
    return bool(e >= 0) if e.is_number else e.is_nonnegative is True


@register(aten.permute.default, aten.permute_copy.default)
def permute(ctx, x, dims):
    dims = [norm_dim(d, x.ndim) for d in dims]
    inverse = [dims.index(k) for k in range(x.ndim)]
    return view_map(x, [x.sizes[d] for d in dims], lambda idx: [idx[inverse[k]] for k in range(x.ndim)])


@register(aten.t.default, aten.transpose.int)
def transpose(ctx, x, d0=0, d1=1):
    if x.ndim < 2:
        return x
    dims = list(range(x.ndim))
    d0, d1 = norm_dim(d0, x.ndim), norm_dim(d1, x.ndim)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(ctx, x, dims)


@register(aten.expand.default, aten.expand_copy.default)
def expand(ctx, x, sizes, implicit=False):
    sizes = out_sizes(ctx)
    return view_map(x, sizes, broadcast_map(ctx, x.sizes, sizes))


@register(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(ctx, x, dim):
    dim = norm_dim(dim, x.ndim + 1)
    sizes = list(x.sizes)
    sizes.insert(dim, ONE)
    return view_map(x, sizes, lambda idx: list(idx[:dim]) + list(idx[dim + 1:]))


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.dim,
          aten.squeeze_copy.dims, aten.squeeze_copy.default)
def squeeze(ctx, x, dims=None):
    if dims is None:
        dims = range(x.ndim)
    elif isinstance(dims, int):
        dims = [dims]
    drop = {norm_dim(d, x.ndim) for d in dims if x.ndim and x.sizes[norm_dim(d, x.ndim)] == 1}
    keep = [d for d in range(x.ndim) if d not in drop]

    def index_map(idx):
        it = iter(idx)
        return [ZERO if d in drop else next(it) for d in range(x.ndim)]
    return view_map(x, [x.sizes[d] for d in keep], index_map)


@register(aten.select.int, aten.select_copy.int)
def select(ctx, x, dim, index):
    dim = norm_dim(dim, x.ndim)
    index = sympy.sympify(index)  # an int, or a size expression (x[x.size(0) - 1])
    if not ctx.facts.known(sympy.Ge(index, 0)):
        if not ctx.facts.known(sympy.Lt(index, 0)):
            raise Fallback("a select index that may be negative or not")
        index = index + x.sizes[dim]  # eager checked it is in range
    return view_map(x, x.sizes[:dim] + x.sizes[dim + 1:],
                    lambda idx: list(idx[:dim]) + [index] + list(idx[dim:]))


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.ndim)
    if x.sizes[dim].is_number:
        start, end, step = slice(start, end, step).indices(int(x.sizes[dim]))
    else:
        start = slice_start(ctx, start, x.sizes[dim])
    sizes = list(x.sizes)
    sizes[dim] = out_sizes(ctx)[dim]  # the length (end only bounds it): the trace's answer
    return view_map(x, sizes, lambda idx: list(idx[:dim]) + [start + idx[dim] * step] + list(idx[dim + 1:]))


def slice_start(ctx, start, size):
    """The first index of a slice of a dim of symbolic `size`, clamped as Python clamps it: a
    negative start counts from the end and stops at 0 (x[-512:] of 100 rows starts at row 0), a
    start past the end stops there. Each clamp stays in the index (Min/Max) unless the guards prove
    it does nothing; a start whose sign the guards do not fix declines (aten slices it)."""
    if start is None:
        return ZERO
    start = sympy.sympify(start)
    if ctx.facts.known(sympy.Ge(start, 0)):
        return ctx.facts.clamp(start, 0, size)
    if ctx.facts.known(sympy.Lt(start, 0)):
        return ctx.facts.clamp(size + start, 0, size)
    raise Fallback("a slice start that may be negative or not")


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.split_copy.Tensor,
          aten.split_with_sizes_copy.default)
def split(ctx, x, split_size, dim=0):
    dim = norm_dim(dim, x.ndim)
    metas = ctx.out_meta()
    outs, start = [], 0
    for m in metas:
        length = ir.size_expr(m.shape[dim])
        sizes = list(x.sizes)
        sizes[dim] = length
        outs.append(view_map(x, sizes, lambda idx, s=start: list(idx[:dim]) + [s + idx[dim]] + list(idx[dim + 1:])))
        start += length
    return outs


@register(aten.unbind.int, aten.unbind_copy.int)
def unbind(ctx, x, dim=0):
    dim = norm_dim(dim, x.ndim)
    return [view_map(x, x.sizes[:dim] + x.sizes[dim + 1:],
                     lambda idx, i=i: list(idx[:dim]) + [sympy.Integer(i)] + list(idx[dim:]))
            for i in range(len(ctx.out_meta()))]


@register(aten.flip.default)
def flip(ctx, x, dims):
    dims = {norm_dim(d, x.ndim) for d in dims}
    return view_map(x, x.sizes, lambda idx: [x.sizes[d] - 1 - i if d in dims else i for d, i in enumerate(idx)])


@register(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    dim1, dim2 = norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim)
    rest = [d for d in range(x.ndim) if d not in (dim1, dim2)]

    def index_map(idx):
        full = [None] * x.ndim
        for d, i in zip(rest, idx):
            full[d] = i
        full[dim1] = idx[-1] + max(-offset, 0)
        full[dim2] = idx[-1] + max(offset, 0)
        return full
    return view_map(x, out_sizes(ctx), index_map)


@register(aten.repeat.default)
def repeat(ctx, x, repeats):
    sizes = out_sizes(ctx)
    lead = len(repeats) - x.ndim
    factors = repeats[lead:]
    return TensorValue(sizes, x.dtype, lambda idx: x.loader(tuple(
        ZERO if s == 1 else i if f == 1 else sympy.Mod(i, s) for i, s, f in zip(idx[lead:], x.sizes, factors))))


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
          aten._reshape_alias.default)
def view(ctx, x, sizes, *unused):
    sizes = out_sizes(ctx)
    if x.view is not None:
        strides = view_strides(x.view.layout, sizes)
        if strides is None:
            strides = traced_view_strides(ctx, x.view.layout)
        if strides is not None:
            return ir.view_value(x.view.name, ir.Layout(sizes, strides, x.dtype, x.view.layout.offset,
                                                        x.view.layout.device))
    index_map = split_only_map(x.sizes, sizes)
    if index_map is not None:
        return TensorValue(sizes, x.dtype, lambda idx: x.loader(tuple(index_map(idx))))
    # merging dims of a computed value would need div/mod per element: compute it once instead
    if x.view is not None and x.view.layout.strides == ir.contiguous_strides(x.sizes):
        raise Fallback("a reshape kiln cannot express as a view of symbolic sizes")
    base = ctx.realize(x, ir.Layout(x.sizes, ir.contiguous_strides(x.sizes), x.dtype))
    return view(ctx, base, sizes)


def traced_view_strides(ctx, layout):
    """The strides the trace gave an aten.view whose input had `layout` there too, or None. Covers
    views whose sizes sympy cannot match up (s0 * s1 // 4 from a -1 over symbolic sizes)."""
    node = ctx.current_node
    src = node.args[0].meta.get("val") if node.target is aten.view.default else None
    if not isinstance(src, torch.Tensor) or (tuple(ir.size_expr(s) for s in src.shape) != tuple(layout.sizes)
                                             or tuple(ir.size_expr(s) for s in src.stride()) != tuple(layout.strides)):
        return None
    return tuple(ir.size_expr(s) for s in ctx.out_meta().stride())


def view_strides(layout, new_sizes):
    """Strides that view `layout` as `new_sizes` without a copy, or None (as torch's view)."""
    old = [(s, st) for s, st in zip(layout.sizes, layout.strides) if s != 1]
    new_strides = [None] * len(new_sizes)
    oi, ni = 0, 0
    new_nontrivial = [k for k, s in enumerate(new_sizes) if s != 1]
    for k, s in enumerate(new_sizes):
        if s == 1:
            new_strides[k] = ONE
    # walk groups: a run of old dims that is contiguous within itself maps to a run of new dims
    while oi < len(old) or ni < len(new_nontrivial):
        if oi >= len(old) or ni >= len(new_nontrivial):
            return None
        group_old, numel_old = [old[oi]], old[oi][0]
        oi += 1
        group_new, numel_new = [new_nontrivial[ni]], new_sizes[new_nontrivial[ni]]
        ni += 1
        while numel_old != numel_new:
            if ir.size_hint(numel_old) < ir.size_hint(numel_new):  # ordering only: groups must end equal
                if oi >= len(old):
                    return None
                group_old.append(old[oi])
                numel_old *= old[oi][0]
                oi += 1
            else:
                if ni >= len(new_nontrivial):
                    return None
                group_new.append(new_nontrivial[ni])
                numel_new *= new_sizes[new_nontrivial[ni]]
                ni += 1
        for (s0, st0), (s1, st1) in zip(group_old, group_old[1:]):
            if st0 != st1 * s1:
                return None
        stride = group_old[-1][1]
        for k in reversed(group_new):
            new_strides[k] = stride
            stride = stride * new_sizes[k]
    if any(s == 0 for s in new_sizes):
        return ir.contiguous_strides(new_sizes)
    return tuple(new_strides)


def split_only_map(old_sizes, new_sizes):
    """index map old <- new when the reshape only splits old dims (or adds/drops size-1 dims)."""
    old = [k for k, s in enumerate(old_sizes) if s != 1]
    new = [k for k, s in enumerate(new_sizes) if s != 1]
    groups, ni = [], 0
    for k in old:
        group, numel = [], ONE
        while numel != old_sizes[k]:
            if ni >= len(new) or ir.size_hint(numel * new_sizes[new[ni]]) > ir.size_hint(old_sizes[k]):
                return None
            group.append(new[ni])
            numel = numel * new_sizes[new[ni]]
            ni += 1
        groups.append((k, group))
    if ni != len(new):
        return None

    def index_map(idx):
        out = [ZERO] * len(old_sizes)
        for k, group in groups:
            flat, stride = ZERO, ONE
            for d in reversed(group):
                flat = flat + idx[d] * stride
                stride = stride * new_sizes[d]
            out[k] = flat
        return out
    return index_map


# ---- reductions -----------------------------------------------------------------------------

def reduce_dims(x, dims):
    if x.ndim == 0:
        return []
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_dim(d, x.ndim) for d in dims})


NO_IDENTITY = ("max", "min", "argmax", "argmin")


def reduction(ctx, x, dims, keepdim, reduction_type, dtype, value_fn=None, acc_dtype=None):
    """Reduce `x` over `dims`; value_fn(value, full_index) -> the Expr reduced (default: x)."""
    out_dims = [d for d in range(x.ndim) if d not in dims]
    sizes = [ONE if d in dims else x.sizes[d] for d in range(x.ndim)] if keepdim else [x.sizes[d] for d in out_dims]
    reduction_sizes = [x.sizes[d] for d in dims]
    acc_dtype = acc_dtype or calc_dtype(dtype)
    if reduction_type in NO_IDENTITY and not all(ctx.facts.known(sympy.Ge(s, 1)) for s in reduction_sizes):
        # eager raises on an empty max/min/argmax; aten raises the same error when the kernel runs
        raise Fallback(f"{reduction_type} over a dim that may be empty")

    def inner(idx, ridx):
        full, it, rit = [], iter(idx), iter(ridx)
        for d in range(x.ndim):
            if d in dims:
                full.append(next(rit))
                if keepdim:
                    next(it)
            else:
                full.append(next(it))
        value = x.loader(tuple(full))
        value = value_fn(value, full) if value_fn else value
        return value if reduction_type in ("argmax", "argmin") else cast(value, acc_dtype)
    return ctx.reduction(sizes, reduction_sizes, reduction_type, inner, dtype)


def keepdim_index(full, dims):
    return tuple(ZERO if d in dims else i for d, i in enumerate(full))


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, x, dims=None, keepdim=False, dtype=None):
    check_real(x)
    out_dtype = ctx.out_meta().dtype
    return reduction(ctx, x, reduce_dims(x, dims), keepdim, "sum", out_dtype)


@register(aten.prod.default, aten.prod.dim_int)
def prod(ctx, x, dim=None, keepdim=False, dtype=None):
    check_real(x)
    if isinstance(dim, torch.dtype):  # prod(x, dtype): the output dtype comes from the node's meta
        dim = None
    if ctx.out_meta().dtype == torch.float16:  # kernels accumulate halves in float: 256*256/256 is no inf
        raise Fallback("float16 prod: eager rounds every partial product to float16")
    return reduction(ctx, x, reduce_dims(x, dim), keepdim, "prod", ctx.out_meta().dtype)


def divide_by(ctx, total, n, dtype):
    """total / n as a lazy value of `dtype`."""
    return TensorValue(total.sizes, dtype,
                       lambda idx: cast(op("truediv", cast(total.loader(idx), calc_dtype(dtype)),
                                           scalar(n, calc_dtype(dtype)) if ir.is_symbolic(n)
                                           else const(float(n), calc_dtype(dtype))), dtype))


@register(aten.mean.dim, aten.mean.default)
def mean(ctx, x, dims=None, keepdim=False, dtype=None):
    check_real(x)
    out_dtype = ctx.out_meta().dtype
    dims = reduce_dims(x, dims)
    total = reduction(ctx, x, dims, keepdim, "sum", calc_dtype(out_dtype), acc_dtype=calc_dtype(out_dtype))
    return divide_by(ctx, total, ir.sympy_product(x.sizes[d] for d in dims), out_dtype)


@register(aten.amax, aten.amin)
def amax(ctx, x, dims=(), keepdim=False):
    check_real(x)
    kind = "max" if ctx.current_node.target == aten.amax.default else "min"
    return reduction(ctx, x, reduce_dims(x, dims), keepdim, kind, x.dtype)


@register(aten.max.default, aten.min.default)
def max_all(ctx, x):
    check_real(x)
    kind = "max" if ctx.current_node.target == aten.max.default else "min"
    return reduction(ctx, x, list(range(x.ndim)), False, kind, x.dtype)


@register(aten.argmax.default, aten.argmin.default)
def argmax(ctx, x, dim=None, keepdim=False):
    check_real(x)
    kind = "argmax" if ctx.current_node.target == aten.argmax.default else "argmin"
    if dim is None and keepdim:
        raise Fallback("argmax over all dims with keepdim")
    return reduction(ctx, x, reduce_dims(x, dim), keepdim, kind, torch.int64)


@register(aten.max.dim, aten.min.dim)
def max_dim(ctx, x, dim, keepdim=False):
    check_real(x)
    is_max = ctx.current_node.target == aten.max.dim
    dims = reduce_dims(x, dim)
    values = reduction(ctx, x, dims, keepdim, "max" if is_max else "min", x.dtype)
    indices = reduction(ctx, x, dims, keepdim, "argmax" if is_max else "argmin", torch.int64)
    return values, indices


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def any_all(ctx, x, dims=None, keepdim=False):
    check_real(x)
    kind = "any" if ctx.current_node.target in (aten.any.default, aten.any.dim, aten.any.dims) else "all"
    out_dtype = ctx.out_meta().dtype
    total = reduction(ctx, x, reduce_dims(x, dims), keepdim, kind, torch.bool, acc_dtype=torch.bool)
    return total if out_dtype == torch.bool else TensorValue(total.sizes, out_dtype,
                                                             lambda idx: cast(total.loader(idx), out_dtype))


def var_and_mean(ctx, x, dims, correction, keepdim, dtype):
    """Numerically stable variance: the mean first, then the sum of squared deviations from it (two
    passes), or, where the device's backend has one (`one_pass_variance`), both in one pass over the
    rows (welford_m2: Welford's update)."""
    compute = calc_dtype(dtype)
    n = ir.sympy_product(x.sizes[d] for d in dims)
    backend = ctx.backends.for_device(ctx.device)
    one_pass = backend is not None and backend.one_pass_variance
    if not one_pass and x.view is None:
        # both passes read one stored (rounded) copy, as eager's kernel reads its input: a value
        # computed again in the second pass can round otherwise (gcc fuses `a * b - mean` into an fma),
        # and the variance of one element came out inf (dev != 0, divided by 0), not eager's NaN
        x = ctx.realize(x)
    mean_kept = divide_by(ctx, reduction(ctx, x, dims, True, "sum", compute), n, compute)

    def squared_deviation(value, full):
        dev = op("sub", cast(value, compute), mean_kept.loader(keepdim_index(full, dims)))
        return op("mul", dev, dev)
    if one_pass:
        sq = reduction(ctx, x, dims, keepdim, "welford_m2", compute)
    else:
        sq = reduction(ctx, x, dims, keepdim, "sum", compute, value_fn=squared_deviation)
    if ir.is_symbolic(n):
        if correction != int(correction):
            raise Fallback("a fractional correction over a symbolic count")
        denominator = scalar(sympy.Max(n - int(correction), 0), compute)
    else:
        denominator = const(max(float(n) - correction, 0.0), compute)
    var = TensorValue(sq.sizes, dtype,
                      lambda idx: cast(op("truediv", sq.loader(idx), denominator), dtype))
    if keepdim:
        mean_out = mean_kept
    else:
        mean_out = squeeze(ctx, mean_kept, dims) if dims else mean_kept
    return var, TensorValue(mean_out.sizes, dtype, lambda idx: cast(mean_out.loader(idx), dtype)), mean_kept


def correction_of(correction, unbiased=None):
    if correction is None:
        return 1 if unbiased is None or unbiased else 0
    return correction


@register(aten.var.correction)
def var(ctx, x, dims=None, correction=None, keepdim=False):
    check_real(x)
    if not x.dtype.is_floating_point:
        raise Fallback("var of integers")
    return var_and_mean(ctx, x, reduce_dims(x, dims), correction_of(correction), keepdim, ctx.out_meta().dtype)[0]


@register(aten.std.correction)
def std(ctx, x, dims=None, correction=None, keepdim=False):
    v = var(ctx, x, dims, correction, keepdim)
    return TensorValue(v.sizes, v.dtype,
                       lambda idx: cast(op("sqrt", cast(v.loader(idx), calc_dtype(v.dtype))), v.dtype))


@register(aten.var_mean.correction)
def var_mean(ctx, x, dims=None, correction=None, keepdim=False):
    check_real(x)
    if not x.dtype.is_floating_point:
        raise Fallback("var of integers")
    v, m, _ = var_and_mean(ctx, x, reduce_dims(x, dims), correction_of(correction), keepdim, ctx.out_meta()[0].dtype)
    return v, m


@register(aten._softmax.default, aten._log_softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
    check_real(x)
    dtype = ctx.out_meta().dtype
    compute = calc_dtype(dtype)
    dims = reduce_dims(x, dim)
    xs = TensorValue(x.sizes, compute, lambda idx: cast(x.loader(idx), compute))
    peak = reduction(ctx, xs, dims, True, "max", compute)

    def shifted(idx):
        return op("sub", xs.loader(idx), peak.loader(keepdim_index(idx, dims)))
    exps = TensorValue(x.sizes, compute, lambda idx: op("exp", shifted(idx)))
    total = reduction(ctx, exps, dims, True, "sum", compute)
    if ctx.current_node.target == aten._log_softmax.default:
        fn = lambda idx: op("sub", shifted(idx), op("log", total.loader(keepdim_index(idx, dims))))  # noqa: E731
    else:
        fn = lambda idx: op("truediv", op("exp", shifted(idx)), total.loader(keepdim_index(idx, dims)))  # noqa: E731
    return TensorValue(x.sizes, dtype, lambda idx: cast(fn(idx), dtype))


@register(aten.native_layer_norm.default)
def native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    check_real(x)
    metas = ctx.out_meta()
    dtype, stat_dtype = metas[0].dtype, metas[1].dtype
    compute = calc_dtype(dtype)
    dims = list(range(x.ndim - len(normalized_shape), x.ndim))
    var_v, _, mean_kept = var_and_mean(ctx, x, dims, 0, True, compute)
    rstd = TensorValue(var_v.sizes, compute, lambda idx: op("rsqrt", op("add", var_v.loader(idx), const(eps, compute))))
    first = x.ndim - len(normalized_shape)

    def fn(idx):
        stat_idx = keepdim_index(idx, dims)
        y = op("mul", op("sub", cast(x.loader(idx), compute), mean_kept.loader(stat_idx)), rstd.loader(stat_idx))
        if weight is not None:
            y = op("mul", y, cast(weight.loader(idx[first:]), compute))
        if bias is not None:
            y = op("add", y, cast(bias.loader(idx[first:]), compute))
        return cast(y, dtype)
    out = TensorValue(x.sizes, dtype, fn)
    stats = [TensorValue(v.sizes, stat_dtype, lambda idx, v=v: cast(v.loader(idx), stat_dtype))
             for v in (mean_kept, rstd)]
    return (out, *stats)


# ---- cat, padding, gathers --------------------------------------------------------------------

def in_bounds(sym, lo, hi):
    """Expr: lo <= sym < hi, for a sympy index."""
    i = index_expr(sym)
    lo, hi = scalar(sympy.sympify(lo), torch.int64), scalar(sympy.sympify(hi), torch.int64)
    return op("logical_and", op("ge", i, lo, dtype=torch.bool), op("lt", i, hi, dtype=torch.bool), dtype=torch.bool)


def clamped(sym, size):
    """sym clamped into [0, size) (to 0 when size is 0: a load nothing selects stays in bounds)."""
    return sympy.Min(sympy.Max(sym, 0), sympy.Max(size - 1, 0))


# a cat is fused into its consumers as a chain of selects: each element loads from every part (at a
# clamped index, a gather where the cat dim is the contiguous one), so it costs O(parts) per element.
# Past this many parts, aten's cat (one contiguous copy per part) and a plain load are cheaper:
# DenseNet-121's batch norm + ReLU over a cat of 7 parts took 4 ms for 1.6M elements, the copy ~0.6;
# over the whole model, kernels + aten cats took 52 ms a call with up to 16 parts fused, 25 ms with
# up to 4, 21 ms with up to 2. Two stay fused: rotate_half's halves, a cache and its new entries
CAT_FUSE_MAX_PARTS = 2


@register(aten.cat.default)
def cat(ctx, tensors, dim=0):
    check_real(*tensors)
    sizes, dtype = out_sizes(ctx), ctx.out_meta().dtype
    parts = [t for t in tensors if not (t.ndim == 1 and t.sizes[0] == 0)]
    if not parts or len(parts) > CAT_FUSE_MAX_PARTS:
        raise Fallback(f"empty cat, or a cat of over {CAT_FUSE_MAX_PARTS} parts (aten's copies are cheaper)")
    dim = norm_dim(dim, len(sizes))
    if all(t.sizes[dim] == 0 for t in parts):  # nothing to load from (the result is empty)
        raise Fallback("every part is empty along the cat dim")
    if any(t.sizes[dim] != 0 and not ctx.facts.known(sympy.Ge(t.sizes[dim], 1)) for t in parts):
        # each part is loaded (at a clamped index) wherever the cat reads: one that may be empty
        # when it runs has no element to load
        raise Fallback("a part whose symbolic length may be 0")
    offsets, start = [], 0
    for t in parts:
        offsets.append(start)
        start = start + t.sizes[dim]

    def fn(idx):
        # every branch loads at a clamped (in-bounds) index, so the select is branch-free and safe
        result = None
        for t, off in reversed(list(zip(parts, offsets))):
            if t.sizes[dim] == 0:
                continue
            local = list(idx)
            local[dim] = clamped(idx[dim] - off, t.sizes[dim])
            value = cast(t.loader(tuple(local)), calc_dtype(dtype))
            if result is None:
                result = value
            else:
                result = op("where", in_bounds(idx[dim], off, off + t.sizes[dim]), value, result)
        return cast(result, dtype)
    return TensorValue(sizes, dtype, fn)


@register(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    check_real(x)
    sizes, dtype = out_sizes(ctx), x.dtype
    if not all(ctx.facts.known(sympy.Ge(s, 1)) for s in x.sizes):  # padding reads x at a clamped index
        raise Fallback("padding a tensor that is or may be empty")
    before = {x.ndim - 1 - k // 2: pad[k] for k in range(0, len(pad), 2)}

    def fn(idx):
        local, valid = list(idx), None
        for d, b in before.items():
            local[d] = clamped(idx[d] - b, x.sizes[d])
            check = in_bounds(idx[d] - b, 0, x.sizes[d])
            valid = check if valid is None else op("logical_and", valid, check, dtype=torch.bool)
        loaded = cast(x.loader(tuple(local)), calc_dtype(dtype))
        return cast(op("where", valid, loaded, const(value, calc_dtype(dtype))) if valid is not None else loaded, dtype)
    return TensorValue(sizes, dtype, fn)


@register(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    check_real(weight)
    sizes = out_sizes(ctx)
    k = indices.ndim
    row_of = index_checker(ctx, weight.sizes[0], "embedding rows")

    def fn(idx):
        row = row_of(indices.loader(tuple(idx[:k])))
        return weight.loader((row,) + tuple(idx[k:]))
    return TensorValue(sizes, weight.dtype, fn)


@register(aten.index_select.default)
def index_select(ctx, x, dim, index):
    check_real(x)
    if x.ndim == 0:
        raise Fallback("index_select on a 0-d tensor")
    dim = norm_dim(dim, x.ndim)
    pick_of = index_checker(ctx, x.sizes[dim], f"index_select on dimension {dim}")

    def fn(idx):
        pick = index.loader((idx[dim],) if index.ndim else ())
        return x.loader(tuple(idx[:dim]) + (pick_of(pick),) + tuple(idx[dim + 1:]))
    return TensorValue(out_sizes(ctx), x.dtype, fn)


@register(aten.gather.default)
def gather(ctx, x, dim, index, sparse_grad=False):
    check_real(x)
    dim = norm_dim(dim, x.ndim)
    if x.ndim == 0 or index.ndim != x.ndim:
        raise Fallback("gather on a 0-d tensor")
    pick_of = index_checker(ctx, x.sizes[dim], f"gather on dimension {dim}")  # no negative indices, as eager

    def fn(idx):
        return x.loader(tuple(idx[:dim]) + (pick_of(index.loader(tuple(idx))),) + tuple(idx[dim + 1:]))
    return TensorValue(out_sizes(ctx), x.dtype, fn)


@register(aten.index.Tensor)
def index(ctx, x, indices):
    """Advanced indexing with one index tensor (x[:, idx]); other patterns go to aten."""
    check_real(x)
    used = [k for k, t in enumerate(indices) if t is not None]
    if len(used) != 1 or indices[used[0]].dtype not in (torch.int64, torch.int32):
        raise Fallback("advanced indexing with several or boolean index tensors")
    dim, ind = used[0], indices[used[0]]
    row_of = index_checker(ctx, x.sizes[dim], f"indexing dimension {dim}", wraps=True)

    def fn(idx):
        row = row_of(ind.loader(tuple(idx[dim:dim + ind.ndim])))
        return x.loader(tuple(idx[:dim]) + (row,) + tuple(idx[dim + ind.ndim:]))
    return TensorValue(out_sizes(ctx), x.dtype, fn)


# ---- prims (some decompositions, mean among them, produce them) -------------------------------

@register(prims.sum.default)
def prims_sum(ctx, x, dims, output_dtype=None):
    check_real(x)
    return reduction(ctx, x, reduce_dims(x, list(dims)) if dims else list(range(x.ndim)), False, "sum",
                     ctx.out_meta().dtype)


@register(prims.broadcast_in_dim.default)
def broadcast_in_dim(ctx, x, shape, broadcast_dimensions):
    sizes = out_sizes(ctx)
    dims = list(broadcast_dimensions)
    index_map = broadcast_map(ctx, x.sizes, [sizes[d] for d in dims])
    return view_map(x, sizes, lambda idx: index_map([idx[d] for d in dims]))


@register(prims.div.default)
def prims_div(ctx, a, b):
    check_real(a, b)
    name = "truediv" if ctx.out_meta().dtype.is_floating_point else "truncdiv"
    return pointwise(ctx, lambda x, y: op(name, x, y), a, b)


for _target, _name in {prims.mul.default: "mul", prims.add.default: "add", prims.sub.default: "sub",
                       prims.maximum.default: "maximum", prims.minimum.default: "minimum"}.items():
    register(_target)(_binary(_name, narrow=False))  # prims take operands already converted
