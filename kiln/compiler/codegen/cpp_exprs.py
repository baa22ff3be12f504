"""IR expressions as C++: types (`CTYPES`, `compute_ctype`), literals, sympy indices (`cindex`),
`ExprPrinter` (an Expr DAG as typed temporaries) and the reductions' initial values and
`omp simd` operators. Shared by every C++ kernel writer (cpp, cpp_columns, cpp_sequential).
"""
import math

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.codegen.cpp_prelude import VECTOR_LIBM, VECTOR_LIBM_BINARY
from kiln.compiler.codegen.index_print import IndexSpelling, LoopExprPrinter, print_index

# storage types. bool tensors are read as bytes (a load is `byte != 0`): gcc 12 vectorizes no loop
# that loads a `bool` (a causal or padding mask beside float math: softmax rows ran scalar)
CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "uint8_t",
    torch.float16: "_Float16", torch.bfloat16: "uint16_t",
}


def compute_ctype(dtype):
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype in ir.HALF_DTYPES else CTYPES[dtype]


def literal(value, dtype):
    ctype = compute_ctype(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{ctype}>::infinity()"
        text = repr(value)
        return f"{text}f" if ctype == "float" else text
    return f"({ctype}){int(value)}LL" if ctype == "int64_t" else f"({ctype}){int(value)}"


def cindex(e):
    """A sympy integer expression as C++ (int64 arithmetic; floor divisions as index_print says)."""
    return print_index(e, CPP_INDEX)


CPP_INDEX = IndexSpelling(divide="/", minimum="kiln_imin", maximum="kiln_imax", power="kiln_ipow<int64_t>({0}, {1})",
                          big_suffix="LL", unsupported=NotImplementedError,
                          floordiv="kiln_floordiv<int64_t>({0}, {1})", mod="kiln_remainder<int64_t>({0}, {1})")


UNARY_CALLS = {name: f"std::{name}" for name in ("sqrt", "floor", "ceil", "trunc", "lgamma")}
UNARY_CALLS.update(round="std::nearbyint", relu="kiln_relu", sign="kiln_sign", isinf="std::isinf",
                   exp="kiln_exp", tanh="kiln_tanh", sigmoid="kiln_sigmoid")
BINARY_OPS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "bitwise_and": "&", "bitwise_or": "|",
              "bitwise_xor": "^", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
              # both sides are computed temporaries: no short circuit to keep, and branches (&&) stop
              # gcc from vectorizing the loop (a padded max-pool window's validity tests)
              "logical_and": "&", "logical_or": "|"}
BINARY_CALLS = {"maximum": "kiln_max", "minimum": "kiln_min",
                "floordiv": "kiln_floordiv", "truncdiv": "kiln_truncdiv", "remainder": "kiln_remainder",
                "fmod": "kiln_fmod", "ipow": "kiln_ipow"}


class ExprPrinter(LoopExprPrinter):
    """Prints Exprs into `lines` as typed temporaries, sharing equal subexpressions."""

    def __init__(self, lines, indent, memory, locals_, rows=None, outer_values=()):
        self.lines, self.indent = lines, indent
        self.memory = memory       # prints loads and index checks (codegen/cpp_memory.Memory)
        self.locals = locals_      # buffer name -> C++ variable holding its value here
        self.rows = rows or {}     # buffer name -> its element in the per-thread row array
        self.outer_values = set(outer_values)  # buffers held in registers from before this loop
        self.mapping = {}          # node loop var -> kernel loop expression
        self.memo, self.cse = {}, {}

    def temp(self, key, ctype, code):
        if key in self.cse:
            return self.cse[key]
        name = f"t{len(self.cse)}_{self.indent}"
        self.lines.append("  " * self.indent + f"{ctype} {name} = {code};")
        self.cse[key] = name
        return name

    def index(self, e, extra=None):
        return cindex(self.mapped(e, extra))

    def _print(self, e):
        ctype = compute_ctype(e.dtype)
        if e.op == "const":
            return literal(e.args[0], e.dtype)
        if e.op == "index":
            code = self.index(e.args[0])
            return self.temp(("index", code, ctype), ctype, code if ctype == "int64_t" else f"({ctype})({code})")
        if e.op == "load":
            name, index, bindings = e.args
            if name in self.locals and not bindings:
                return self.locals[name]
            if name in self.rows:  # fusion guarantees the read is at the point that wrote it
                return self.temp(("load", self.rows[name]), ctype, self.rows[name])
            extra = {sym: sympy.Symbol(self.expr(value)) for sym, value in bindings}
            code = self.memory.load(name, self.index(index, extra))
            if e.dtype == torch.float16:
                code = f"(float){code}"
            elif e.dtype == torch.bfloat16:
                code = f"kiln_bf16_load({code})"
            elif e.dtype == torch.bool:
                code = f"({code} != 0)"
            return self.temp(("load", code), ctype, code)
        if e.op == "check_index":  # an index read from a tensor (see lowering_base.index_checker)
            value, bound, what, wraps = e.args
            key = ("check_index", self.expr(value), bound.args[0], wraps)
            if key not in self.cse:
                index, record = self.memory.checked_index(key[1], cindex(bound.args[0]), what, wraps)
                self.temp(key, ctype, index)
                self.lines.append("  " * self.indent + record)
            return self.cse[key]
        args = [self.expr(a) for a in e.args]
        if e.op == "truediv" and ctype in ("float", "double") and self.is_loop_invariant(e.args[1]):
            # x / s with s fixed for the whole loop: multiply by 1/s, computed once (eager's own
            # softmax and norms do the same); at most 1 ulp from the quotient
            return self.temp(("mul_recip", tuple(args), ctype), ctype, f"({args[0]} * (({ctype})1 / {args[1]}))")
        return self.temp((e.op, tuple(args), ctype), ctype, self.op_code(e, args, ctype))

    def is_loop_invariant(self, e):
        """A value computed before this loop: a reduction result or per-row value of the kernel."""
        return e.op == "load" and not e.args[2] and e.args[0] in self.outer_values

    @staticmethod
    def op_code(e, args, ctype):
        op = e.op
        if op in BINARY_OPS:
            return f"({args[0]} {BINARY_OPS[op]} {args[1]})"
        if op in VECTOR_LIBM or op in VECTOR_LIBM_BINARY:
            return f"{op}{'f' if ctype == 'float' else ''}({', '.join(args)})"
        if op in BINARY_CALLS:
            return f"{BINARY_CALLS[op]}({args[0]}, {args[1]})"
        if op in UNARY_CALLS:
            return f"{UNARY_CALLS[op]}({args[0]})"
        simple = {
            "neg": "(-({0}))", "abs": "std::abs({0})", "rsqrt": "(({t})1 / std::sqrt({0}))",
            "reciprocal": "(({t})1 / {0})",
            "bitwise_not": "(~{0})", "logical_not": "(!{0})", "isnan": "({0} != {0})",
            "logical_xor": "((bool){0} != (bool){1})", "where": "({0} ? {1} : {2})",
            "cast": "static_cast<{t}>({0})",
        }
        if op == "cast" and ctype not in ("float", "double", "bool") and e.args[0].dtype.is_floating_point:
            return f"static_cast<{ctype}>(static_cast<{ctype}>({args[0]}) ^ kiln_opaque_zero)"
        if op in simple:
            return simple[op].format(*args, t=ctype)
        if op == "round_to":
            return f"kiln_round_f16({args[0]})" if e.dtype == torch.float16 else f"kiln_round_bf16({args[0]})"
        raise NotImplementedError(f"no C++ for op {op}")


REDUCTIONS = {
    # kind: (init, update, omp simd reduction operator or None)
    "sum": ("0", "{acc} = {acc} + {v};", "+"),
    "prod": ("1", "{acc} = {acc} * {v};", "*"),
    "any": ("false", "{acc} = {acc} || {v};", "||"),
    "all": ("true", "{acc} = {acc} && {v};", "&&"),
    "max": (None, "{acc} = kiln_max_acc({acc}, {v});", "max"),
    "min": (None, "{acc} = kiln_min_acc({acc}, {v});", "min"),
}


def simd_reduction_op(kind, acc_ctype):
    """The `omp simd reduction` operator for an accumulator, or None (then the loop stays scalar).
    Float max/min use kiln's own reductions: NaN propagates and the identity is +-inf."""
    op = REDUCTIONS[kind][2]
    if op in ("max", "min"):
        if acc_ctype == "bool":
            return None
        if acc_ctype in ("float", "double"):
            return f"kiln_{op}r"
    return op


def reduction_init(kind, ctype):
    if REDUCTIONS[kind][0] is not None:
        return f"({ctype}){REDUCTIONS[kind][0]}"
    if ctype in ("float", "double"):
        return f"{'-' if kind == 'max' else ''}std::numeric_limits<{ctype}>::infinity()"
    limit = "lowest" if kind == "max" else "max"
    return f"std::numeric_limits<{ctype}>::{limit}()"
