"""C++/OpenMP code for a scheduled program: one translation unit, no torch headers.

Each run of kernels with no extern call between them becomes one `extern "C"` entry taking raw
pointers (and, with dynamic shapes, the size symbols its loops use as int64_t); the wrapper calls
it once. Inside, a kernel is an OpenMP-parallel loop over its outer points (when the work is big
enough: decided when it runs if its sizes are symbolic) with `#pragma omp simd` innermost loops; reductions
accumulate in registers (`omp simd reduction` where reassociation is allowed); values that
never leave the kernel stay in registers. No -ffast-math: NaN/inf follow IEEE as eager does,
and the helpers below give max/min/floor-division/remainder eager's exact semantics.
"""
import dataclasses
import math
import re

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.codegen import cpp_columns
from kiln.compiler.schedule import Kernel, kernel_stages, loop_var

CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
    torch.float16: "_Float16", torch.bfloat16: "uint16_t",
}
# below this many float elements a sum accumulates in float (omp simd keeps 8-16 partial sums)
DOUBLE_ACCUMULATE_FROM = 4096
PARALLEL_CHUNK = 4096

# glibc's libmvec has SIMD versions of these; declaring them `omp declare simd` lets gcc call
# the vector variants from vectorized loops (math.h only does so under -ffast-math)
VECTOR_LIBM = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
               "log", "log2", "log10", "log1p", "expm1", "exp2", "erfc")
VECTOR_LIBM_BINARY = ("atan2", "pow")
LINK_FLAGS = ("-fno-math-errno", "-fno-trapping-math", "-lmvec")
PRELUDE = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

template <typename T> static inline T kiln_max(T a, T b) { return (a != a || a >= b) ? a : b; }
template <typename T> static inline T kiln_min(T a, T b) { return (a != a || a <= b) ? a : b; }
template <typename T> static inline T kiln_relu(T a) { return a < 0 ? T(0) : a; }
template <typename T> static inline T kiln_sign(T a) { return T((a > T(0)) - (a < T(0))); }
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && (b < 0) != (mod < 0)) div -= T(1);
    if (div == 0) return std::copysign(T(0), a / b);
    T fl = std::floor(div);
    return div - fl > T(0.5) ? fl + T(1) : fl;
  } else {
    if (b == 0) return 0;
    T q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
  }
}
template <typename T> static inline T kiln_truncdiv(T a, T b) { return b == 0 ? T(0) : T(a / b); }
template <typename T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T mod = std::fmod(a, b);
    if (mod != 0 && (b < 0) != (mod < 0)) mod += b;
    return mod;
  } else {
    if (b == 0) return 0;
    T r = a % b;
    if (r != 0 && (r < 0) != (b < 0)) r += b;
    return r;
  }
}
template <typename T> static inline T kiln_fmod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::fmod(a, b);
  else return b == 0 ? T(0) : T(a % b);
}
template <typename T> static inline T kiln_ipow(T base, T exp) {
  T result = 1;
  while (exp > 0) { if (exp & 1) result *= base; base *= base; exp >>= 1; }
  return result;
}
static inline float kiln_round_f16(float x) { return (float)(_Float16)x; }
static inline float kiln_bf16_load(uint16_t v) {
  uint32_t u = (uint32_t)v << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline uint16_t kiln_bf16_store(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if (f != f) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
static inline float kiln_round_bf16(float x) { return kiln_bf16_load(kiln_bf16_store(x)); }

// float exp/tanh/erf/sigmoid written so gcc vectorizes them (libm calls stop vectorization
// without -ffast-math). exp: Cody-Waite reduction + degree-6 polynomial, ~1.5 ulp, inf/NaN/
// denormal results as IEEE; double uses libm.
static inline float kiln_exp(float x) {
  float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  xc = x != x ? 0.0f : xc;
  float t = xc * 1.44269504088896341f + 12582912.0f;  // round to nearest via the 1.5*2^23 trick
  float n = t - 12582912.0f;
  int32_t ti; std::memcpy(&ti, &t, 4);
  int32_t ni = ti - 0x4B400000;
  float r = std::fma(n, -0.693359375f, xc);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500E-4f;
  p = std::fma(p, r, 1.3981999507E-3f);
  p = std::fma(p, r, 8.3334519073E-3f);
  p = std::fma(p, r, 4.1665795894E-2f);
  p = std::fma(p, r, 1.6666665459E-1f);
  p = std::fma(p, r, 5.0000001201E-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  int32_t n1 = ni >> 1, n2 = ni - n1;  // two scalings reach denormal results
  int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2; std::memcpy(&s1, &b1, 4); std::memcpy(&s2, &b2, 4);
  float res = p * s1 * s2;
  res = x > 88.72283905206835f ? std::numeric_limits<float>::infinity() : res;
  res = x < -103.97207708f ? 0.0f : res;
  return x != x ? x : res;
}
static inline double kiln_exp(double x) { return std::exp(x); }
static inline float kiln_tanh(float x) {
  float ax = x < 0 ? -x : x;
  float z = x * x;
  float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z
                  + 1.33314422036E-1f) * z - 3.33332819422E-1f) * z * x + x;
  float big = 1.0f - 2.0f / (kiln_exp(2.0f * ax) + 1.0f);
  big = x < 0 ? -big : big;
  float r = ax < 0.625f ? small : big;
  // NaN, and -0.0 (the polynomial gives +0.0), as eager; two selects, not one with ||, which
  // gcc does not vectorize
  r = x == 0.0f ? x : r;
  return x != x ? x : r;
}
static inline double kiln_tanh(double x) { return std::tanh(x); }
// erf as eager's vectorized CPU kernel computes it (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7)
static inline float kiln_erf(float x) {
  float ax = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float y = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  float r = 1.0f - y * kiln_exp(-ax * ax);
  r = x < 0 ? -r : r;
  r = x == 0.0f ? x : r;  // -0.0 (1 - y*exp gives +0.0), and NaN, as eager (two selects: see tanh)
  return x != x ? x : r;
}
static inline double kiln_erf(double x) { return std::erf(x); }
template <typename T> static inline T kiln_sigmoid(T x) { return T(1) / (T(1) + kiln_exp(-x)); }

extern "C" {
DECLARE_VECTOR_LIBM
// float -> int casts are xor-ed with this (0, but the compiler cannot know: another library may
// define it), so gcc cannot turn (float)(int)x into trunc(x), which under -fno-trapping-math it
// does, and which keeps trunc(-0.25) = -0.0 where the int round trip gives +0.0
int kiln_opaque_zero = 0;
}

#pragma omp declare reduction(kiln_maxr : float, double : omp_out = kiln_max(omp_out, omp_in)) \
    initializer(omp_priv = -std::numeric_limits<decltype(omp_orig)>::infinity())
#pragma omp declare reduction(kiln_minr : float, double : omp_out = kiln_min(omp_out, omp_in)) \
    initializer(omp_priv = std::numeric_limits<decltype(omp_orig)>::infinity())
"""


PRELUDE = PRELUDE.replace("DECLARE_VECTOR_LIBM", "\n".join(
    f"#pragma omp declare simd notinbranch\n{t} {name}{suffix}({', '.join([t] * arity)});"
    for names, arity in ((VECTOR_LIBM, 1), (VECTOR_LIBM_BINARY, 2))
    for name in names for t, suffix in (("float", "f"), ("double", ""))))


def compute_ctype(dtype):
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
    """A sympy integer expression as C++ (int64 arithmetic). Sizes and indices are never negative,
    so the floor divisions and remainders of ShapeEnv expressions (FloorDiv, PythonMod, ...) are
    C's / and %."""
    if e.is_Integer:
        return f"{int(e)}LL" if abs(int(e)) >= 2**31 else str(int(e))
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        return "(" + " + ".join(cindex(a) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + " * ".join(cindex(a) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + " * ".join([cindex(e.base)] * int(e.exp)) + ")"
    kind = type(e).__name__
    args = [cindex(a) for a in e.args]
    if kind in ("Mod", "PythonMod"):
        return f"({args[0]} % {args[1]})"
    if kind in ("FloorDiv", "CleanDiv"):
        return f"({args[0]} / {args[1]})"
    if kind == "ModularIndexing":  # (a / b) % c
        return f"(({args[0]} / {args[1]}) % {args[2]})"
    if kind == "PowByNatural":
        return f"kiln_ipow<int64_t>({args[0]}, {args[1]})"
    if kind in ("Min", "Max"):
        fn = "std::min" if kind == "Min" else "std::max"
        out = args[0]
        for a in args[1:]:
            out = f"{fn}<int64_t>({out}, {a})"
        return out
    raise NotImplementedError(f"index expression {e}")


UNARY_CALLS = {name: f"std::{name}" for name in ("sqrt", "floor", "ceil", "trunc", "lgamma")}
UNARY_CALLS.update(round="std::nearbyint", relu="kiln_relu", sign="kiln_sign", isinf="std::isinf",
                   exp="kiln_exp", tanh="kiln_tanh", erf="kiln_erf", sigmoid="kiln_sigmoid")
BINARY_OPS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "bitwise_and": "&", "bitwise_or": "|",
              "bitwise_xor": "^", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
              "logical_and": "&&", "logical_or": "||"}
BINARY_CALLS = {"maximum": "kiln_max", "minimum": "kiln_min",
                "floordiv": "kiln_floordiv", "truncdiv": "kiln_truncdiv", "remainder": "kiln_remainder",
                "fmod": "kiln_fmod", "ipow": "kiln_ipow"}


class ExprPrinter:
    """Prints Exprs into `lines` as typed temporaries, sharing equal subexpressions."""

    def __init__(self, lines, indent, pointers, locals_, rows=None, outer_values=()):
        self.lines, self.indent = lines, indent
        self.pointers = pointers   # buffer name -> C++ pointer name
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
        mapping = dict(self.mapping)
        mapping.update(extra or {})
        return cindex(sympy.expand(e.xreplace(mapping)))

    def expr(self, e):
        key = (id(e), tuple(sorted(self.mapping.items(), key=str)))
        if key not in self.memo:
            self.memo[key] = self._print(e)
        return self.memo[key]

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
            code = f"{self.pointers[name]}[{self.index(index, extra)}]"
            if e.dtype == torch.float16:
                code = f"(float){code}"
            elif e.dtype == torch.bfloat16:
                code = f"kiln_bf16_load({code})"
            return self.temp(("load", code), ctype, code)
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
    "max": (None, "{acc} = kiln_max({acc}, {v});", "max"),
    "min": (None, "{acc} = kiln_min({acc}, {v});", "min"),
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


@dataclasses.dataclass
class Entry:
    """One native function: the kernels it runs and the buffers it takes, in argument order."""
    name: str
    kernels: list
    args: list          # buffer names passed as pointers
    uses_workspace: bool
    sizes: list = dataclasses.field(default_factory=list)  # size symbols passed as int64_t, after the pointers
    checks_indices: bool = False  # takes `int64_t* kiln_err` last: a scatter met an out-of-range index


class KernelWriter:
    def __init__(self, kernel: Kernel, program, ws_offsets, options, pointer_of):
        self.kernel, self.program, self.options = kernel, program, options
        self.ws_offsets, self.pointer_of = ws_offsets, pointer_of
        self.threads = options.get("cpp.threads", -1)
        if self.threads is None or self.threads < 1:
            self.threads = torch.get_num_threads()
        self.min_work = options.get("cpp.min_parallel_work", 32768)

    def write(self):
        k = self.kernel
        if k.nodes[0].sequential is not None:  # a Scan or Scatter: its own loops
            from kiln.compiler.codegen.cpp_sequential import write_sequential
            return write_sequential(self)
        outer, inner = k.dims()
        self.outer_vars = [loop_var("x", i) for i in range(len(outer))]
        self.inner_vars = [loop_var("r", i) for i in range(len(inner))]
        self.outer, self.inner = outer, inner
        self.maps = {n.name: k.var_map(n, outer, inner) for n in k.nodes}
        lines = [f"  // {k.name}: " + ", ".join(f"{n.name}{'=' + n.reduction_type if n.is_reduction else ''}"
                                              for n in k.nodes) + f"  [{k.numel} x {k.rnumel}]", "  {"]
        lines += self.pointer_lines()
        total = k.numel * k.rnumel
        # symbolic sizes: whether to start threads is decided when the kernel runs
        self.parallel_if = "" if total.is_number else f" if({cindex(sympy.expand(total))} >= {self.min_work})"
        work = int(total) if total.is_number else self.min_work
        parallel = work >= self.min_work and self.threads > 1 and (k.numel != 1 or k.rnumel == 1)
        # one big reduction (x.sum()): the threads split the reduction loop instead
        self.split_reduction = work >= self.min_work and self.threads > 1 and k.numel == 1
        body_indent = 2 + len(outer)
        body = []
        self.locals = {}
        self.rows = self.row_arrays(body, body_indent)
        outer_printer = ExprPrinter(body, body_indent, self.pointers, self.locals)
        stages = kernel_stages(k)
        pointwise_only = k.rnumel == 1 and not any(n.is_reduction for n in k.nodes)
        if not pointwise_only and cpp_columns.fits(self, stages):  # x.sum(0): vectorize across columns
            return lines + cpp_columns.write_columns(self, stages, parallel) + ["  }"]
        for stage in stages:
            if pointwise_only:
                self.write_inner_body(stage, outer_printer)
            else:
                self.write_stage(stage, body, body_indent, outer_printer)
        lines += self.outer_loops(outer, body, parallel, simd_innermost=pointwise_only)
        lines.append("  }")
        return lines

    def pointer_lines(self):
        names = set()
        for n in self.kernel.nodes:
            names |= n.reads
            if self.program.storage[n.name] != "local":
                names.add(n.name)
        self.pointers, out = {}, []
        for name in sorted(names, key=lambda s: (len(s), s)):
            if self.program.storage.get(name) in ("local", "row"):
                continue
            buf = self.program.buffers[name]
            ctype = CTYPES[buf.layout.dtype]
            written = any(n.name == name for n in self.kernel.nodes)
            const = "" if written else "const "
            source = (f"(ws + {cindex(sympy.sympify(self.ws_offsets[name]))})"
                      if self.program.storage[name] == "workspace"
                      else self.pointer_of(name))
            out.append(f"    {const}{ctype}* __restrict__ {name} = ({const}{ctype}*){source};")
            self.pointers[name] = name
        return out

    def row_arrays(self, body, indent):
        """Declare the per-thread row arrays of this kernel; name -> its element at the point."""
        rows = {}
        flat, stride = sympy.Integer(0), sympy.Integer(1)
        for v, size in zip(reversed(self.inner_vars), reversed(self.inner)):
            flat += v * stride
            stride *= size
        for n in self.kernel.nodes:
            if self.program.storage[n.name] == "row":
                body += self.row_declaration(n, indent)
                rows[n.name] = f"row_{n.name}[{cindex(flat)}]"
        return rows

    def row_declaration(self, node, indent):
        ctype, pad, name = compute_ctype(node.layout.dtype), "  " * indent, f"row_{node.name}"
        if self.kernel.rnumel.is_number:
            return [f"{pad}{ctype} {name}[{int(self.kernel.rnumel)}];"]
        # symbolic row length: one buffer per thread, kept between calls and grown when a longer
        # row comes (no allocation per row, no stack size limit)
        length = cindex(sympy.expand(self.kernel.rnumel))
        return [f"{pad}static thread_local std::vector<{ctype}> store_{name};",
                f"{pad}if ((int64_t)store_{name}.size() < {length}) store_{name}.resize({length});",
                f"{pad}{ctype}* __restrict__ {name} = store_{name}.data();"]

    def outer_loops(self, sizes, body, parallel, simd_innermost):
        lines, ind = [], 2
        pragma_threads = f" num_threads({self.threads}){self.parallel_if}"
        n = len(sizes)
        if n == 0:
            return ["    {"] + body + ["    }"]
        if simd_innermost and n == 1 and parallel:
            size = cindex(sizes[0])
            lines.append("    #pragma omp parallel for" + pragma_threads)
            lines.append(f"    for (int64_t c0 = 0; c0 < {size}; c0 += {PARALLEL_CHUNK}) {{")
            lines.append(f"      const int64_t c0_end = std::min<int64_t>(c0 + {PARALLEL_CHUNK}, {size});")
            lines.append("      #pragma omp simd")
            lines.append("      for (int64_t x0 = c0; x0 < c0_end; ++x0) {")
            lines += body
            lines += ["      }", "    }"]
            return lines
        for i, s in enumerate(sizes):
            pad = "  " * (ind + i)
            if i == 0 and parallel:
                collapse = n - 1 if simd_innermost else n
                clause = f" collapse({collapse})" if collapse > 1 else ""
                if collapse >= 1:
                    lines.append(f"{pad}#pragma omp parallel for{clause}{pragma_threads}")
            if simd_innermost and i == n - 1:
                lines.append(f"{pad}#pragma omp simd")
            lines.append(f"{pad}for (int64_t x{i} = 0; x{i} < {cindex(s)}; ++x{i}) {{")
        lines += body
        for i in reversed(range(n)):
            lines.append("  " * (ind + i) + "}")
        return lines

    def write_inner_body(self, stage, printer):
        """Pointwise nodes (and size-1 reductions) at one loop point."""
        for node in stage:
            printer.mapping = self.maps[node.name]
            value = printer.expr(node.body)
            self.finish_value(node, value, printer)

    def finish_value(self, node, value, printer):
        dtype = node.layout.dtype
        ctype = compute_ctype(dtype)
        local = f"v_{node.name}"
        printer.lines.append("  " * printer.indent + f"{ctype} {local} = {value};")
        self.locals[node.name] = local
        if node.name in self.rows:
            printer.lines.append("  " * printer.indent + f"{self.rows[node.name]} = {local};")
        elif self.program.storage[node.name] != "local":
            store = printer.index(node.store_index)
            out = f"({CTYPES[dtype]}){local}" if dtype == torch.float16 else (
                f"kiln_bf16_store({local})" if dtype == torch.bfloat16 else local)
            printer.lines.append("  " * printer.indent + f"{node.name}[{store}] = {out};")

    def write_stage(self, stage, body, indent, outer_printer):
        k = self.kernel
        level_outer = k.role(stage[0]) == "outer"
        if level_outer:
            for node in stage:
                outer_printer.mapping = self.maps[node.name]
                self.finish_value(node, outer_printer.expr(node.body), outer_printer)
            return
        pad = "  " * indent
        reductions = [n for n in stage if n.is_reduction]
        accs, clauses = {}, []
        for n in reductions:
            acc_ctype = self.accumulator_ctype(n)
            acc = f"acc_{n.name}"
            accs[n.name] = (acc, acc_ctype)
            if n.reduction_type in ir.ARG_REDUCTIONS:
                init = reduction_init("max", acc_ctype) if n.reduction_type == "window_argmax" else "0"
                body.append(f"{pad}{acc_ctype} {acc} = {init}; int64_t {acc}_i = -1;")
            else:
                body.append(f"{pad}{acc_ctype} {acc} = {reduction_init(n.reduction_type, acc_ctype)};")
                simd_op = simd_reduction_op(n.reduction_type, acc_ctype)
                clauses.append(f"reduction({simd_op}:{acc})" if simd_op else None)
        simd_ok = all(c is not None for c in clauses) and len(clauses) == len(reductions)
        loop_lines = []
        inner_indent = indent + max(len(self.inner), 0) + (1 if not self.inner else 0)
        printer = ExprPrinter(loop_lines, inner_indent, self.pointers, self.locals, self.rows, set(self.locals))
        self.write_loop_body(stage, accs, printer)
        if not self.inner:
            body.append(f"{pad}{{")
            body += loop_lines
            body.append(f"{pad}}}")
        else:
            split = self.split_reduction and simd_ok
            for i, s in enumerate(self.inner):
                ipad = "  " * (indent + i)
                innermost = i == len(self.inner) - 1
                if i == 0 and split:
                    kind = "parallel for simd" if innermost else "parallel for"
                    body.append(f"{ipad}#pragma omp {kind} num_threads({self.threads}){self.parallel_if} "
                                + " ".join(clauses))
                elif innermost and simd_ok:
                    body.append(f"{ipad}#pragma omp simd " + " ".join(c for c in clauses if c))
                body.append(f"{ipad}for (int64_t r{i} = 0; r{i} < {cindex(s)}; ++r{i}) {{")
            body += loop_lines
            for i in reversed(range(len(self.inner))):
                body.append("  " * (indent + i) + "}")
        for node in stage:
            if not node.is_reduction:  # its register is out of scope after this loop
                del self.locals[node.name]
        for node in reductions:
            acc, _ = accs[node.name]
            result = f"{acc}_i" if node.reduction_type in ir.ARG_REDUCTIONS else acc
            outer_printer.mapping = self.maps[node.name]
            self.finish_value(node, self.reduction_result(node, result), outer_printer)

    def accumulator_ctype(self, node):
        """The C++ type a reduction accumulates in: long float sums in double."""
        acc_ctype = compute_ctype(node.body.dtype)
        rnumel = self.kernel.rnumel
        if node.reduction_type == "sum" and acc_ctype == "float" and (
                not rnumel.is_number or int(rnumel) >= DOUBLE_ACCUMULATE_FROM):
            return "double"
        return acc_ctype

    @staticmethod
    def reduction_result(node, result):
        """C++ for the reduction's value from its accumulator `result`, in the node's dtype."""
        dtype = node.layout.dtype
        if dtype in ir.HALF_DTYPES:
            return f"kiln_round_{'f16' if dtype == torch.float16 else 'bf16'}((float){result})"
        return f"({compute_ctype(dtype)}){result}"

    def write_loop_body(self, stage, accs, printer):
        """The body of a stage's reduction loop: reductions accumulate, other nodes are computed."""
        for node in stage:
            printer.mapping = self.maps[node.name]
            value = printer.expr(node.body)
            if node.is_reduction:
                self.accumulate(node, value, accs[node.name], printer)
            else:
                self.finish_value(node, value, printer)

    def accumulate(self, node, value, acc_info, printer):
        acc, acc_ctype = acc_info
        pad = "  " * printer.indent
        if node.reduction_type in ir.ARG_REDUCTIONS:
            flat = sympy.Integer(0)
            stride = sympy.Integer(1)
            for v, s in zip(reversed(node.rvars()), reversed(node.reduction_sizes)):
                flat += v * stride
                stride *= s
            position = printer.index(flat)
            better = ">" if node.reduction_type == "argmax" else "<"
            takes = f"{acc}_i < 0 || {value} {better} {acc} || ({value} != {value} && {acc} == {acc})"
            if node.reduction_type == "window_argmax":
                takes = f"{value} > {acc} || {value} != {value}"
            printer.lines.append(f"{pad}if ({takes}) {{ {acc} = {value}; {acc}_i = {position}; }}")
            return
        update = REDUCTIONS[node.reduction_type][1].format(acc=acc, v=f"({acc_ctype}){value}")
        printer.lines.append(pad + update)


def generate(program, ws_offsets, options, symbols=()):
    """The C++ source for `program` and its entries (one per run of kernels between externs).
    `symbols`: the size symbols (and float symbols: doubles); an entry takes those its kernels use."""
    entries, current = [], None
    for step in program.steps:
        if isinstance(step, Kernel):
            if current is None:
                current = Entry(f"kiln_entry{len(entries)}", [], [], False)
                entries.append(current)
            current.kernels.append(step)
        else:
            current = None
    parts = [PRELUDE]
    for entry in entries:
        args = []

        def pointer_of(name, args=args):
            if name not in args:
                args.append(name)
            return f"p_{name}"
        body = []
        for kernel in entry.kernels:
            body += KernelWriter(kernel, program, ws_offsets, options, pointer_of).write()
        entry.args = args
        entry.uses_workspace = any(program.storage[n.name] == "workspace" or
                                   any(program.storage.get(r) == "workspace" for r in n.reads)
                                   for k in entry.kernels for n in k.nodes)
        from kiln.compiler.codegen.cpp_sequential import ERROR_FLAG, needs_error_flag
        entry.checks_indices = any(needs_error_flag(k) for k in entry.kernels)
        used = set(re.findall(r"\b[a-z]+\d+\b", "\n".join(body)))
        entry.sizes = [str(sym) for sym in symbols if str(sym) in used]
        ctypes_of = {str(sym): "int64_t" if sym.is_integer else "double" for sym in symbols}
        params = ([f"void* p_{a}" for a in args] + (["char* ws"] if entry.uses_workspace else [])
                  + [f"const {ctypes_of[name]} {name}" for name in entry.sizes])
        params += [f"int64_t* {ERROR_FLAG}"] if entry.checks_indices else []
        parts.append(f'extern "C" void {entry.name}({", ".join(params)}) {{')
        parts += body
        parts.append("}\n")
    return "\n".join(parts), entries
