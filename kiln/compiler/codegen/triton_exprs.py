"""IR expressions as Triton: types (`TL_TYPES`), literals, sympy indices (`tindex`), `TritonPrinter`
(an Expr DAG as temporaries over blocks of elements) and the reductions' identities and combines.

Half dtypes are computed in float32 (loaded, then converted; rounded where the IR rounds), as eager
and the C++ backend do. Integer division and remainder are written so that they mean the same
whether `//` truncates (compiled Triton) or floors (the interpreter, NumPy).
"""
import math

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.codegen.kernel_backend import BackendUnsupported
from kiln.compiler.codegen.index_print import IndexSpelling, LoopExprPrinter, print_index

TL_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
}


def compute_dtype(dtype):
    return torch.float32 if dtype in ir.HALF_DTYPES else dtype


def tl_type(dtype):
    return TL_TYPES[compute_dtype(dtype)]


def literal(value, dtype):
    """A 0-d constant of `dtype` (typed: a bare Python number would be int32 or float32)."""
    if dtype == torch.bool:
        text = "1" if value else "0"
    elif dtype.is_floating_point:
        value = float(value)
        text = f'float("{value}")' if not math.isfinite(value) else repr(value)
    else:
        text = str(int(value))
    return f"tl.full([], {text}, {tl_type(dtype)})"


def tindex(e):
    """A sympy index expression as Triton integer arithmetic (floor divisions as index_print says)."""
    return print_index(e, TRITON_INDEX)


TRITON_INDEX = IndexSpelling(divide="//", minimum="tl.minimum", maximum="tl.maximum", power=None, big_suffix="",
                             unsupported=BackendUnsupported, floordiv="kiln_floordiv({0}, {1})",
                             mod="kiln_remainder({0}, {1})")


CORE_UNARY = {"exp": "tl.exp", "log": "tl.log", "sin": "tl.sin", "cos": "tl.cos", "sqrt": "tl.sqrt_rn",
              "floor": "tl.floor", "ceil": "tl.ceil", "abs": "tl.abs", "erf": "tl.erf", "exp2": "tl.exp2",
              "log2": "tl.log2", "sigmoid": "tl.sigmoid"}
LIBM_UNARY = ("tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "log10", "log1p",
              "expm1", "erfc", "lgamma", "trunc")
LIBM_BINARY = ("atan2", "pow")
# float division ops as eager computes them (ATen's div_floor_floating and remainder); the lowerings
# write a float trunc division as trunc(a / b)
FLOAT_DIVISIONS = {"floordiv": "kiln_floordiv_float({0}, {1})", "remainder": "kiln_remainder_float({0}, {1})",
                   "fmod": "libm.fmod({0}, {1})"}
BLOCK_SHAPES = {"xmask": "[XBLOCK, 1]", "mask": "[XBLOCK, RBLOCK]"}  # the points each mask covers
BINARY_OPS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "bitwise_and": "&", "bitwise_or": "|",
              "bitwise_xor": "^", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
              "logical_and": "&", "logical_or": "|"}


class TritonPrinter(LoopExprPrinter):
    """Prints Exprs into `lines` as temporaries, sharing equal subexpressions. `mask`: the Triton
    mask of the points this code runs at (loads outside it read 0)."""

    def __init__(self, lines, indent, prefix, mask, locals_, index_site=None):
        self.lines, self.indent, self.prefix, self.mask = lines, indent, prefix, mask
        self.index_site = index_site  # what -> the code of a check site (codegen/cpp_memory.Checks)
        self.locals = locals_      # buffer name -> variable holding its value at this point
        self.mapping = {}          # node loop var -> kernel loop expression
        self.memo, self.cse = {}, {}
        self.narrow = True         # a load that does not move with the reduction loads over [XBLOCK, 1]

    def temp(self, key, code):
        if key not in self.cse:
            name = f"{self.prefix}{len(self.cse)}"
            self.lines.append("    " * self.indent + f"{name} = {code}")
            self.cse[key] = name
        return self.cse[key]

    def index(self, e, extra=None):
        return tindex(self.mapped(e, extra))

    def pointer(self, name, index, extra=None):
        """(pointer block, mask) for element `index` of buffer `name`: over [XBLOCK, 1] (with xmask)
        when the index does not move with the reduction variables (and `narrow`: rows are not
        empty, so some point of the row reads it), else over the code's points."""
        e = self.mapped(index, extra)
        names = {s.name[0] for s in e.free_symbols}
        mask = self.mask if (names - {"x", "s"}) or not self.narrow else "xmask"
        return f"{name} + ({tindex(e)} + tl.zeros({BLOCK_SHAPES[mask]}, tl.int32))", mask

    def _print(self, e):
        if e.op == "const":
            return self.temp(("const", e.args[0], e.dtype), literal(e.args[0], e.dtype))
        if e.op == "index":
            code = self.index(e.args[0])
            return self.temp(("index", code, e.dtype), f"({code} + tl.full([], 0, tl.int64)).to({tl_type(e.dtype)})")
        if e.op == "load":
            name, index, bindings = e.args
            if name in self.locals and not bindings:
                return self.locals[name]
            extra = {sym: sympy.Symbol(self.expr(value)) for sym, value in bindings}
            pointer, mask = self.pointer(name, index, extra)
            code = f"tl.load({pointer}, {mask}, other=0)"
            if e.dtype in ir.HALF_DTYPES:
                code += ".to(tl.float32)"
            return self.temp(("load", code), code)
        if e.op == "check_index":
            return self.checked_index(e)
        args = [self.expr(a) for a in e.args]
        return self.temp((e.op, tuple(args), e.dtype), op_code(e, args))


    def checked_index(self, e):
        """An index read from a tensor, 0 where it is out of range; a point that is out of range
        stores its check site's code and the bound in `kiln_err` (the wrapper raises as eager)."""
        value, bound, what, wraps = e.args
        v, b = self.expr(value), self.index(bound.args[0])
        key = ("check_index", v, b, wraps)
        if key not in self.cse:
            w = self.temp(key + ("wrapped",), f"tl.where({v} < 0, {v} + {b}, {v})") if wraps else v
            bad = self.temp(key + ("bad",), f"(({w} < 0) | ({w} >= {b})) & {self.mask}")
            pad = "    " * self.indent
            code = self.index_site(what)
            self.lines.append(f"{pad}tl.store(kiln_err + {bad}.to(tl.int32) * 0, {bad}.to(tl.int64) * 0 + {code}, {bad})")
            self.lines.append(f"{pad}tl.store(kiln_err + 2 + {bad}.to(tl.int32) * 0, {bad}.to(tl.int64) * 0 + {b}, "
                              f"{bad})")
            self.temp(key, f"tl.where({bad}, 0, {w})")
        return self.cse[key]


def op_code(e, args):
    op, dtype = e.op, compute_dtype(e.dtype)
    a = args[0]
    is_float = dtype.is_floating_point
    if op in BINARY_OPS:
        return f"({a} {BINARY_OPS[op]} {args[1]})"
    if op in ("maximum", "minimum"):
        nan = ", propagate_nan=tl.PropagateNan.ALL" if is_float else ""
        return f"tl.{op}({a}, {args[1]}{nan})"
    if op in ("sqrt", "rsqrt") and dtype == torch.float64:  # sqrt_rn is float32's; float64's sqrt is exact
        return f"tl.sqrt({a})" if op == "sqrt" else f"(tl.full([], 1.0, tl.float64) / tl.sqrt({a}))"
    if op in CORE_UNARY and is_float:
        return f"{CORE_UNARY[op]}({a})"
    if op == "abs":
        return f"tl.where({a} < 0, -{a}, {a})"
    if op == "neg" and is_float:  # Triton's unary minus is 0 - x: -(+0.0) would be +0.0, not eager's -0.0
        return f"({a} * -1.0)"
    if op in LIBM_UNARY and is_float:
        return f"libm.{op}({a})"
    if op in LIBM_BINARY and is_float:
        return f"libm.{op}({a}, {args[1]})"
    simple = {
        "neg": "(-{0})", "rsqrt": "(1.0 / tl.sqrt_rn({0}))", "reciprocal": "(1.0 / {0})",
        "relu": "tl.where({0} < 0, 0, {0})", "round": "libm.nearbyint({0})",
        "isnan": "({0} != {0})", "isinf": '(({0} == float("inf")) | ({0} == float("-inf")))',
        "logical_not": "({0} == 0)", "logical_xor": "(({0} != 0) != ({1} != 0))", "where": "tl.where({0}, {1}, {2})",
        "sign": "(({0} > 0).to({t}) - ({0} < 0).to({t}))", "bitwise_not": "(~{0})",
        "floordiv": "kiln_floordiv({0}, {1})", "remainder": "kiln_remainder({0}, {1})",
        "truncdiv": "kiln_truncdiv({0}, {1})", "fmod": "kiln_truncmod({0}, {1})",
        "ipow": "kiln_ipow({0}, {1})",
    }
    if op in FLOAT_DIVISIONS and is_float:
        return FLOAT_DIVISIONS[op].format(*args)
    if op == "truncdiv" and is_float:
        raise BackendUnsupported("float truncdiv in Triton (never lowered: trunc(a / b))")
    if op == "reciprocal" and dtype == torch.float64:
        return f"(tl.full([], 1.0, tl.float64) / {a})"
    if op in simple:
        return simple[op].format(*args, t=tl_type(dtype))
    if op == "cast":
        if dtype == torch.bool:
            return f"({a} != 0)"
        return f"{a}.to({tl_type(dtype)})"
    if op == "round_to":
        return round_to_half(a, e.dtype)
    raise BackendUnsupported(f"no Triton for op {op} on {dtype}")


def round_to_half(code, dtype):
    """float32 `code` rounded to the nearest `dtype` value (ties to even), held in float32."""
    if dtype == torch.bfloat16:  # by its bits: the interpreter's float32 -> bfloat16 truncates
        return f"kiln_round_bf16({code})"
    return f"{code}.to(tl.float16).to(tl.float32)"


# helpers every kernel module defines (exact whether `//` truncates or floors)
PRELUDE = '''
@triton.jit
def kiln_floordiv(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def kiln_remainder(a, b):
    return a - kiln_floordiv(a, b) * b


@triton.jit
def kiln_truncdiv(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (a < 0)), q + 1, q)


@triton.jit
def kiln_truncmod(a, b):
    return a - kiln_truncdiv(a, b) * b


@triton.jit
def kiln_floordiv_float(a, b):
    # eager's: the quotient of a - fmod(a, b), floored and rounded to the nearest integer; a signed 0
    # where it is 0 (the sign of a / b), and a / b (inf, NaN) where b is 0
    mod = libm.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = tl.floor(div)
    floor = tl.where(div - floor > 0.5, floor + 1, floor)
    quotient = a / b
    floor = tl.where(div == 0, quotient * 0.0, floor)
    return tl.where(b == 0, quotient, floor)


@triton.jit
def kiln_remainder_float(a, b):
    mod = libm.fmod(a, b)
    return tl.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


@triton.jit
def kiln_ipow(base, exp):
    # an integer base ** a constant exponent >= 0 (lowerings.pow_), by squaring; wraps as eager's
    result = base * 0 + 1
    while exp > 0:
        result = tl.where((exp & 1) != 0, result * base, result)
        base = base * base
        exp = exp >> 1
    return result


@triton.jit
def kiln_max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def kiln_min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def kiln_round_bf16(x):
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def kiln_argmax_combine(av, ai, bv, bi):
    # the first largest value, a NaN above all (the first NaN)
    a_nan = av != av
    b_nan = bv != bv
    take_b = (b_nan & (~a_nan | (bi < ai))) | (~a_nan & ~b_nan & ((bv > av) | ((bv == av) & (bi < ai))))
    return tl.where(take_b, bv, av), tl.where(take_b, bi, ai)


@triton.jit
def kiln_argmin_combine(av, ai, bv, bi):
    a_nan = av != av
    b_nan = bv != bv
    take_b = (b_nan & (~a_nan | (bi < ai))) | (~a_nan & ~b_nan & ((bv < av) | ((bv == av) & (bi < ai))))
    return tl.where(take_b, bv, av), tl.where(take_b, bi, ai)


@triton.jit
def kiln_window_argmax_combine(av, ai, bv, bi):
    # max pooling's: the first value above -inf that no earlier one reaches, or the last NaN; -1 for none
    a_nan = (av != av) & (ai >= 0)
    b_nan = (bv != bv) & (bi >= 0)
    by_value = (bv > av) | ((bv == av) & (bi >= 0) & ((ai < 0) | (bi < ai)))
    take_b = tl.where(a_nan | b_nan, b_nan & (~a_nan | (bi > ai)), by_value)
    return tl.where(take_b, bv, av), tl.where(take_b, bi, ai)


@triton.jit
def kiln_welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # two partial (mean, sum of squared deviations, count) of one row as one (Chan et al.)
    n = n_a + n_b
    w = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    delta = mean_b - mean_a
    return mean_a + delta * w, m2_a + m2_b + delta * delta * n_a * w, n


@triton.jit
def kiln_row_m2(v, mask, n):
    # a whole row in registers (0 where masked): the sum of squared deviations from its mean
    mean = tl.sum(v, 1)[:, None] / n
    d = tl.where(mask, v - mean, 0.0)
    return tl.sum(d * d, 1)


@triton.jit
def kiln_mul(a, b):
    return a * b
'''

# reduction kind -> (identity for float, identity for ints (None: the dtype's limit), combine, final reduce over axis 1)
REDUCTIONS = {
    "sum": ("0", "0", "({acc} + {v})", "tl.sum({acc}, 1)"),
    "prod": ("1", "1", "({acc} * {v})", "tl.reduce({acc}, 1, kiln_mul)"),
    "max": ('float("-inf")', None, "kiln_max_nan({acc}, {v})", "tl.reduce({acc}, 1, kiln_max_nan)"),
    "min": ('float("inf")', None, "kiln_min_nan({acc}, {v})", "tl.reduce({acc}, 1, kiln_min_nan)"),
    "any": ("0", "0", "({acc} | {v})", "(tl.max({acc}.to(tl.int8), 1) != 0)"),
    "all": ("1", "1", "({acc} & {v})", "(tl.min({acc}.to(tl.int8), 1) != 0)"),
    # (looped rows: triton_kernels.WELFORD_STEP and kiln_welford_combine; a persistent row's values
    # are all in registers: its mean, then the squared deviations from it)
    "welford_m2": ("0", "0", None, "kiln_row_m2({acc}, mask, rnumel)"),
}


def reduction_identity(kind, dtype):
    kind = {"argmax": "max", "window_argmax": "max", "argmin": "min"}.get(kind, kind)
    if kind not in REDUCTIONS:
        raise BackendUnsupported(f"a {kind} reduction in Triton")
    float_init, int_init, _, _ = REDUCTIONS[kind]
    if dtype.is_floating_point:
        return float_init
    if dtype == torch.bool:
        return "1" if kind in ("all", "min") else "0"
    if int_init is None:
        info = torch.iinfo(dtype)
        return str(info.min if kind == "max" else info.max)
    return int_init
