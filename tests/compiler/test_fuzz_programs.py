"""Differential fuzzing of kiln's compiler: seeded random multi-op programs, eager vs kiln.

`ProgramGen(seed)` writes a random Python function over a vocabulary of torch ops (pointwise with
broadcasting and scalars, comparisons and where, casts, reductions, softmax/layer_norm, views,
cat/stack, gathers and indexing, clamp, in-place ops on intermediates and inputs, matmul) with
random shapes (size-1, size-0, odd, big enough to run in parallel), dtypes and input layouts
(transposed, stepped, expanded, offset). Each op is run eagerly while the program is written: an
op eager rejects is dropped, so every program is valid eager code.

Inputs may alias: an input can be another input itself or an overlapping view of it (`a0[1:]`
beside `a0`). Special functions run on extreme inputs too (+-1e-30..1e30, subnormals, zeros) and
are compared relatively there (erf(1e-30) must be 1.13e-30). Slices take bounds past either end
(`x[-512:]`, `x[2:100]`), which Python clamps.

Several programs share one compiled function (one C++ build per batch keeps CI fast); each batch
runs eagerly and through `kiln.compile` on fresh copies of the same inputs, and every output and
every input's state after the call must match: same dtype and shape, integer/bool values equal,
float values equal or within a tolerance for the dtype. A batch is compiled with static shapes,
with `dynamic=True`, or with automatic dynamic shapes (the default: a first call at other sizes,
then the program's own sizes recompile with those dims symbolic); see SHAPES and CALLS. At sizes
other than the program's own, only *smooth* values (made by continuous ops, see NOT_SMOOTH) are
compared with a tolerance, the rest by dtype and shape. A failing batch is split to name the
failing programs by seed (`python -m tests.compiler.test_fuzz_programs SEED` prints, runs and
minimizes one; KILN_FUZZ_SHAPES picks its shapes).

Exactness. A float value is *exact* when any correct evaluation (any summation order, fused or
not) gives the same bits: inputs lie on a grid of 2**-8 below 2**14, and add/sub/mul/sum keep a
value exact only while its result stays on that grid (then every partial sum is representable).
Discontinuous ops (comparisons, casts to integers, floor/round, argmax, floor division,
remainder, any/all) take exact operands only: on an inexact value a 1-ulp difference, which is
fine, would flip the result. Exact outputs are compared bit for bit; inexact ones with a
tolerance. Ops whose eager result is itself ill-defined are not generated (see `EXCLUDED`).

Reference. An inexact float of eager's carries eager's own rounding errors: of its half-precision
intermediates (rounded at each op, where kiln's fused kernels keep them in float), and of formulas
that cancel (gelu's x/2 * (1 + erf(x/sqrt2)) at x < -5). So beside eager, each batch also runs
eagerly on float64 copies of its float inputs (the same values and layouts; casts written in the
program still happen) with ACCURATE_F. An inexact value of kiln's further from eager's than its
tolerance is still right where it is no further from that reference than eager's value, give or
take the tolerance: a mismatch means kiln is wrong, not that eager is.

KILN_FUZZ_N sets how many programs run (default 24), KILN_FUZZ_SEED0 the first seed,
KILN_FUZZ_SHAPES static | dynamic | automatic | mixed (the default: each batch picks). Long runs
(thousands of programs, a crash or a hang costing one program only): tests/compiler/fuzz_driver.py.
"""
import copy
import dataclasses
import math
import os
import random
import sys
import warnings

import pytest
import torch

import kiln

N_PROGRAMS = int(os.environ.get("KILN_FUZZ_N", "24"))  # CI: two batches; long runs: fuzz_driver.py
SEED0 = int(os.environ.get("KILN_FUZZ_SEED0", "0"))
BATCH = 12
GRID, BOUND, SUM_BOUND = 2.0 ** -8, 2.0 ** 14, 2.0 ** 15
INT_BOUND = 2 ** 15       # integer values stay below this: no product or sum of two overflows int32
MAX_NUMEL = 1 << 17
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-7, 1e-7),
             torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}

# Not generated, because eager's own answer is ill-defined (a mismatch would say nothing):
EXCLUDED = """
- float -> integer casts of NaN, inf or out-of-range values (C++ undefined behaviour in eager too);
- integer results at or beyond INT_BOUND (signed overflow is undefined behaviour in C++);
- prod over more than 16 elements of floats (overflow to inf then inf*0: the order decides NaN vs 0);
- gelu(+inf) (eager's vectorized kernel gives NaN, its scalar tail inf);
- the sign of a zero that max/min/clamp/relu chose between -0.0 and 0.0 (eager's paths differ);
- signbit of NaN (IEEE leaves the sign of a computed NaN unspecified);
- an in-place op reading memory it writes at another element (`t.sub_(t.diagonal())`): eager reads
  some elements before and some after they are written, in its loop's order;
- random ops and ops eager documents as nondeterministic (none are in the vocabulary).
"""

class _AccurateFunctional:
    """torch.nn.functional for the reference, except for functions whose eager formula cancels,
    computed in a form that does not (gelu: x/2 * erfc(-x/sqrt2))."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def gelu(x, approximate="none"):
        if approximate == "tanh":  # 1 + tanh(u) = 2 sigmoid(2u)
            return x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
        return x / 2 * torch.erfc(-x / math.sqrt(2))


ACCURATE_F = _AccurateFunctional()

# ops choosing between -0.0 and 0.0 on a tie: eager's vector and scalar paths pick differently
MINMAX = ("maximum", "minimum", "fmax", "clamp", "hardtanh", "amax", "amin", "torch.max(", "torch.min(", ".max()",
          ".min()", "cummax", "cummin", "max_pool", "relu", "adaptive_max", "sort", "topk", "kthvalue", "hardswish",
          "hardsigmoid", "shrink", "fmin", "vector_norm")
# ops whose result depends on the sign of a zero
SIGN_SENSITIVE = ("signbit", "/", "atan2", "reciprocal", "rsqrt", "**", "fmod", "remainder", "%", "div(", "log")
FLOAT_DTYPES = (torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int64, torch.int32)
SMALL_INT_DTYPES = (torch.int16, torch.uint8)  # uint8 wraps modulo 256, as C++ unsigned arithmetic
SIZES = (1, 1, 2, 3, 4, 5, 7, 8, 13, 16, 33)
# special functions of extreme inputs (op_special); domains kept by abs where needed
SPECIAL_FUNCTIONS = ("torch.erf({x})", "torch.erfc({x})", "torch.exp({x})", "torch.expm1({x})", "torch.log({x}.abs())",
                     "torch.log1p({x}.abs())", "torch.log2({x}.abs())", "torch.log10({x}.abs())", "torch.tanh({x})",
                     "torch.sigmoid({x})", "torch.sin({x})", "torch.cos({x})", "torch.atan({x})", "torch.asinh({x})",
                     "torch.sinh({x})", "torch.cosh({x})", "torch.sqrt({x}.abs())", "torch.rsqrt({x}.abs())",
                     "torch.reciprocal({x})", "F.silu({x})", "F.softplus({x})", "F.logsigmoid({x})", "F.mish({x})",
                     "F.gelu({x})", "torch.atan2({x}, {x}.flip(-1))", "{x}.abs() ** 0.37")
GRID_SCALARS = (0.5, -1.25, 2.0, 3, -2, 1, 0, 0.25, -0.5, 4.0)
OTHER_SCALARS = (0.3, 1e-3, 7.1, -2.7, float("inf"), float("nan"))


# ---- inputs -------------------------------------------------------------------------------------

@dataclasses.dataclass
class InputSpec:
    """One input: its values come from `seed`; `layout` says how it sits in memory."""
    name: str
    shape: tuple
    dtype: torch.dtype
    layout: str        # contiguous | transposed | stepped | expanded | offset
    kind: str          # grid | special | index | unique (distinct indices in [0, high) along the last dim)
    seed: int
    high: int = 0      # index: values in [low, high)
    low: int = 0
    expand_dims: tuple = ()
    step_dim: int = 0
    alias_of: str = ""  # layout "alias": this input is alias_view applied to that earlier input
    alias_view: str = ""

    def make(self, made=None, wide=False):
        """The input tensor; `made`: the inputs made before it, by name (an alias views one). With
        `wide`, a float input's values (the same ones) are float64, in the same layout."""
        if self.layout == "alias":
            return eval(f"base{self.alias_view}", {}, {"base": made[self.alias_of]})
        g = torch.Generator().manual_seed(self.seed)
        shape = list(self.shape)

        def values(shape):
            x = self.values(shape, g)
            return x.double() if wide and x.is_floating_point() else x
        if self.layout == "transposed":
            return values(shape[::-1]).permute(*reversed(range(len(shape))))
        if self.layout == "stepped":
            d = self.step_dim
            big = shape[:d] + [shape[d] * 2 + 1] + shape[d + 1:]
            return values(big).narrow(d, 1, shape[d] * 2).unflatten(d, (shape[d], 2)).select(d + 1, 0)
        if self.layout == "expanded":
            small = [1 if d in self.expand_dims else s for d, s in enumerate(shape)]
            return values(small).expand(*shape)
        if self.layout == "offset":
            n = math.prod(shape)
            return values([n + 3])[3:].view(shape)
        return values(shape)

    def values(self, shape, g):
        if self.kind == "index":
            return torch.randint(self.low, self.high, shape, generator=g, dtype=torch.int64).to(self.dtype)
        if self.kind == "unique":
            keys = torch.rand(list(shape[:-1]) + [self.high], generator=g)
            return keys.argsort(-1)[..., :shape[-1]].to(self.dtype)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=g).bool()
        if self.kind == "extreme":  # +-1e-30..1e30, subnormals and zeros: special functions' far ends
            magnitude = 10.0 ** (torch.rand(shape, generator=g, dtype=torch.float64) * 60 - 30)
            magnitude = magnitude.clamp(max=torch.finfo(self.dtype).max / 4)  # finite in halves too
            sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
            pick = torch.randint(0, 12, shape, generator=g)
            x = torch.where(pick == 0, torch.tensor(1e-40 if self.dtype == torch.float32 else 1e-310), magnitude)
            x = torch.where(pick == 1, torch.tensor(0.0), x)
            return (x * sign).to(self.dtype)
        if not self.dtype.is_floating_point:
            return torch.randint(-8, 9, shape, generator=g).to(self.dtype)
        x = torch.randint(-16, 17, shape, generator=g).to(torch.float64) / 4
        if self.kind == "special" and x.numel():
            pick = torch.randint(0, 8, shape, generator=g)
            for k, v in enumerate((float("nan"), float("inf"), -float("inf"), -0.0)):
                x = torch.where(pick == k, torch.tensor(v, dtype=torch.float64), x)
        return x.to(self.dtype)


def make_inputs(specs, wide=False):
    """The inputs of `specs`, in order (aliases view the tensors made before them); `wide`: float
    inputs in float64 (see InputSpec.make)."""
    made = {}
    for spec in specs:
        made[spec.name] = spec.make(made, wide)
    return list(made.values())


# ---- programs -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Program:
    seed: int
    inputs: list           # InputSpec
    lines: list            # statements of the body
    outputs: list          # (name, tolerance): None when exact (bit for bit), else (rtol, atol)
    input_tolerance: list = dataclasses.field(default_factory=list)  # per input, after the call
    smooth: set = dataclasses.field(default_factory=set)  # outputs and inputs comparable at other sizes
    special: dict = dataclasses.field(default_factory=dict)  # output -> (expr, input): see op_special

    def function_source(self, name="fuzz_program"):
        args = ", ".join(s.name for s in self.inputs)
        body = [f"    {line}" for line in self.lines] or ["    pass"]
        outs = "".join(f"{n}, " for n, _ in self.outputs)
        return f"def {name}({args}):\n" + "\n".join(body) + f"\n    return ({outs})\n"


def is_float(t):
    return t.is_floating_point()


def on_grid(t):
    """Whether the finite values of t are exact in the sense of the module doc."""
    if not is_float(t) or t.numel() == 0:
        return True
    x = t.double()
    x = x[torch.isfinite(x)]
    return bool(((x / GRID).frac() == 0).all() and (x.abs() < BOUND).all())


def same_values(a, b):
    if a.shape != b.shape:
        return False
    a, b = a.double(), b.double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    return bool(((a == b) | both_nan).all())


def reads_what_it_writes_elsewhere(target, operand):
    """Whether an in-place op writing `target` and reading `operand` (broadcast to target's shape)
    reads, at some element, memory it writes at another element."""
    if target.untyped_storage().data_ptr() != operand.untyped_storage().data_ptr():
        return False
    if target.dtype != operand.dtype or not torch.broadcast_shapes(operand.shape, target.shape) == target.shape:
        return True
    memory = torch.arange(target.untyped_storage().nbytes() // target.element_size())
    def where(t):
        return memory.as_strided(t.shape, t.stride(), t.storage_offset())
    written, read = where(target).reshape(-1), where(operand.expand(target.shape)).reshape(-1)
    return bool(((read != written) & torch.isin(read, written)).any())


class Reject(Exception):
    """This op does not fit here: try another."""


# What makes a value not *smooth*: a discontinuous op (comparisons, casts to integers, rounding,
# argmax, indices, division, remainder), a function with a pole or a domain edge (log, sqrt, ...),
# or one that overflows (exp, prod, pow). A smooth value changes little when its inputs do, so at
# sizes other than the ones the program was written at (dynamic shapes' second call), where its
# exactness was not checked, it can still be compared with a tolerance.
NOT_SMOOTH = ("==", "!=", "<", ">", "/", "%", "**", "where", ".long()", ".int()", ".bool()", "torch.int", "torch.bool",
              "argmax", "argmin", "floor", "ceil", "round", "trunc", "sign", "isnan", "isinf", "isfinite", "logical",
              "bitwise", "frac", "&", "|", "^", "log", "sqrt", "reciprocal", "asin", "acos", "atanh", "tan(", "exp",
              "layer_norm", "fmod", "remainder", "div", "prod", "return_indices", ")[1]", "erfc", "~", "group_norm",
              "batch_norm", "normalize", "cosine", "shrink", "copysign", "soft_margin", "sinc")


def is_smooth(expr):
    """Whether `expr` (a statement of a program) keeps values smooth (see NOT_SMOOTH)."""
    return not any(token in expr for token in NOT_SMOOTH)


class ProgramGen:
    """Writes one random program, running each op eagerly as it goes (see the module doc)."""

    def __init__(self, seed, prefix=""):
        self.rng = random.Random(seed)
        self.seed, self.prefix = seed, prefix
        self.inputs, self.lines = [], []
        self.env, self.exact, self.names = {}, {}, []
        self.tol = {}  # name -> the loosest dtype tolerance along the value's history
        self.zero_sign = {}  # name -> whether the sign of its zeros is defined (see MINMAX)
        self.smooth = {}  # name -> made by continuous ops only (see is_smooth): comparable at other sizes
        self.extreme = set()  # extreme inputs and special functions of them: only op_special reads them
        self.must_output = []  # special functions of extreme inputs: always outputs
        self.special = {}  # those outputs -> (their expression, the extreme input it reads)
        self.big = self.rng.random() < 0.15      # sizes that make kernels parallel
        self.allow_empty = self.rng.random() < 0.06
        self.half = self.rng.random() < 0.15

    # -- values --
    def shape(self, ndim=None):
        r = self.rng
        ndim = r.choice((0, 1, 1, 2, 2, 2, 3, 3, 4)) if ndim is None else ndim
        sizes = [r.choice(SIZES) for _ in range(ndim)]
        if self.big and ndim:
            sizes[-1] = r.choice((513, 1031, 4099))
            if ndim > 1:
                sizes[0] = r.choice((33, 64, 9))
        while math.prod(sizes) > MAX_NUMEL // 8:
            sizes[sizes.index(max(sizes))] //= 4
        if self.allow_empty and ndim and r.random() < 0.5:
            sizes[r.randrange(ndim)] = 0
        return tuple(sizes)

    def dtype(self):
        r = self.rng.random()
        if self.half and r < 0.35:
            return self.rng.choice(HALF_DTYPES)
        if r < 0.55:
            return torch.float32
        if r < 0.67:
            return torch.float64
        if r < 0.87:
            return self.rng.choice(INT_DTYPES + SMALL_INT_DTYPES if self.rng.random() < 0.15 else INT_DTYPES)
        return torch.bool

    def new_input(self, shape=None, dtype=None, kind=None, low=0, high=0):
        r = self.rng
        shape = self.shape() if shape is None else tuple(shape)
        dtype = dtype or self.dtype()
        kind = kind or ("special" if dtype.is_floating_point and r.random() < 0.1 else "grid")
        layouts = ["contiguous"] * 4 + ["offset"]
        if len(shape) >= 2:
            layouts.append("transposed")
        if shape and max(shape) > 0:
            layouts += ["stepped"]
        if any(s > 1 for s in shape) and kind != "index":
            layouts.append("expanded")
        if kind == "unique":  # distinct along the last dim of the tensor it makes
            layouts = ["contiguous"]
        spec = InputSpec(f"{self.prefix}a{len(self.inputs)}", shape, dtype, r.choice(layouts), kind,
                         seed=r.randrange(1 << 30), high=high, low=low)
        if spec.layout == "stepped":
            spec.step_dim = r.choice([d for d, s in enumerate(shape) if s > 0])
        if spec.layout == "expanded":
            big_dims = [d for d, s in enumerate(shape) if s > 1]
            spec.expand_dims = tuple(r.sample(big_dims, r.randint(1, len(big_dims))))
        self.inputs.append(spec)
        self.env[spec.name] = spec.make()
        self.exact[spec.name] = True
        self.tol[spec.name] = TOLERANCE.get(dtype, (0, 0))
        self.zero_sign[spec.name] = True
        self.smooth[spec.name] = True
        if kind == "extreme":
            self.extreme.add(spec.name)
        self.names.append(spec.name)
        return spec.name

    def new_alias(self):
        """An input that shares memory with an earlier input: the same tensor, or an overlapping view."""
        r = self.rng
        bases = [s for s in self.inputs if s.layout != "alias" and s.kind not in ("unique", "extreme")]
        if not bases:
            raise Reject("no input to alias")
        base = r.choice(bases)
        t = self.env[base.name]
        views = [""]
        if t.ndim and t.shape[0] >= 2:
            views += ["[1:]", "[:-1]"]
        if t.ndim >= 2:
            views.append(".transpose(0, -1)")
        if t.ndim and t.shape[-1] >= 2:
            views.append("[..., ::2]")
        view = r.choice(views)
        spec = InputSpec(f"{self.prefix}a{len(self.inputs)}", (), base.dtype, "alias", base.kind, seed=0,
                         alias_of=base.name, alias_view=view)
        value = spec.make({base.name: t})
        spec.shape = tuple(value.shape)
        self.inputs.append(spec)
        self.env[spec.name] = value
        for d in (self.exact, self.zero_sign, self.smooth):
            d[spec.name] = d[base.name]
        self.tol[spec.name] = self.tol[base.name]
        self.names.append(spec.name)
        return spec.name

    def usable(self):
        """The values ops may read (not the extreme inputs: see op_special)."""
        return [n for n in self.names if n not in self.extreme]

    def pick(self, pred=lambda t: True):
        """A value, recent ones more likely; a new input when none fits."""
        fits = [n for n in self.usable() if pred(self.env[n])]
        if not fits:
            raise Reject("no operand")
        weights = [(1 + k) ** 2 for k in range(len(fits))]
        return self.rng.choices(fits, weights)[0]

    def scalar(self, t=None, exact_only=False):
        r = self.rng
        if t is not None and t.dtype == torch.bool:
            return r.choice(("True", "False", "2", "0.5"))
        if t is not None and not is_float(t) and r.random() < 0.7:
            return str(r.choice((2, -3, 1, 0, 5)))
        pool = GRID_SCALARS if exact_only or r.random() < 0.8 else OTHER_SCALARS
        v = r.choice(pool)
        return repr(v) if math.isfinite(v) else f"float('{v}')"

    # -- running one statement --
    def run(self, expr, operands, mode="move", needs_exact=False, inplace=None, check=None):
        """Run `name = expr` eagerly; keep it if eager accepts it and the checks pass.

        mode: how exactness flows: "move" (exact iff the float operands are), "arith" (and the
        result is on the grid and equals the float64 computation), "inexact", "cast".
        """
        if needs_exact and not all(self.exact[o] for o in operands if is_float(self.env[o])):
            raise Reject("discontinuous op on an inexact value")
        if any(m in expr for m in SIGN_SENSITIVE) and any(
                not self.zero_sign[o] and is_float(self.env[o]) and bool((self.env[o] == 0).any()) for o in operands):
            raise Reject("an op that sees the sign of a zero whose sign is not defined")
        if inplace and any(reads_what_it_writes_elsewhere(self.env[inplace], self.env[o])
                           for o in operands if o != inplace):
            raise Reject("an in-place op reading memory it writes at another element (EXCLUDED)")
        if mode != "move" and not all(self.exact[o] for o in operands) and \
                any(is_float(self.env[o]) and bool(self.env[o].isinf().any()) for o in operands):
            raise Reject("inf meets an inexact value: whether that is 0 decides inf*0 = NaN")
        name = f"{self.prefix}t{len(self.lines)}"
        env = copy.deepcopy(self.env) if inplace else self.env
        scope = {"torch": torch, "F": torch.nn.functional}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = eval(expr, scope, env)
        except Exception as e:  # eager rejects it: not a program
            raise Reject(str(e)) from None
        if not isinstance(result, torch.Tensor) or result.numel() > MAX_NUMEL:
            raise Reject("not a tensor or too big")
        if result.dtype.is_complex:
            raise Reject("complex")
        if not is_float(result) and result.dtype != torch.bool and result.numel() and \
                result.abs().max() >= INT_BOUND:
            raise Reject("integer overflow risk")
        if check is not None and not check(result, env):
            raise Reject("check")
        exact = self.exactness(expr, result, operands, mode, self.env)
        tol = max([TOLERANCE.get(result.dtype, (0, 0))] + [self.tol[o] for o in operands])
        zero_sign = all(self.zero_sign[o] for o in operands) and not any(m in expr for m in MINMAX)
        smooth = all(self.smooth[o] for o in operands) and is_smooth(expr)
        self.lines.append(f"{name} = {expr}")
        if inplace:
            self.env = env
            target = env[inplace]
            for n in self.names:  # everything sharing the written memory may now be inexact
                t = env[n]
                if t.untyped_storage().data_ptr() == target.untyped_storage().data_ptr():
                    self.exact[n] = self.exact[n] and exact
                    self.tol[n] = max(self.tol[n], tol)
                    self.zero_sign[n] = self.zero_sign[n] and zero_sign
                    self.smooth[n] = self.smooth[n] and smooth
        self.env[name] = result
        self.exact[name] = exact
        self.tol[name] = tol
        self.zero_sign[name] = zero_sign
        self.smooth[name] = smooth
        self.names.append(name)
        return name

    def exactness(self, expr, result, operands, mode, env):
        if not is_float(result):
            return True
        ops_exact = all(self.exact[o] for o in operands)
        if mode == "inexact" or not ops_exact:
            return False
        if mode == "move":
            return on_grid(result)
        if mode == "cast":
            return same_values(result, env[operands[0]]) and on_grid(result)
        # arith: the float64 computation agrees and the result is on the grid
        env64 = {k: (v.to(torch.float64, copy=True) if is_float(v) else v.clone()) for k, v in env.items()}
        try:
            r64 = eval(expr, {"torch": torch, "F": torch.nn.functional}, env64)
        except Exception:
            return False
        return on_grid(result) and same_values(result, r64)

    # -- ops --
    def op_unary(self):
        r = self.rng
        x = self.pick()
        t = self.env[x]
        kind = r.random()
        if kind < 0.45:
            fn = r.choice(("sin", "cos", "tanh", "sigmoid", "atan", "erf", "exp", "expm1", "abs", "neg", "relu",
                           "square", "F.gelu", "F.silu"))
            mode = {"abs": "move", "neg": "move", "relu": "move", "square": "arith"}.get(fn, "inexact")
            if fn in ("exp", "expm1") and not self.exact[x] and is_float(t) and t.numel() and \
                    t.nan_to_num(0, 0, 0).max() > 80:
                raise Reject("exp near overflow")
            if fn == "F.gelu" and is_float(t) and bool((t == float("inf")).any()):
                raise Reject("gelu(inf): eager's vector path gives NaN, its scalar path inf (EXCLUDED)")
            if fn in ("sin", "cos") and not self.exact[x] and is_float(t) and t.numel() and \
                    float(t.abs().nan_to_num(0, 0, 0).max()) > 64:
                raise Reject("sin/cos of a large inexact argument: its rounding is the result's")
            call = f"{fn}({x})" if fn.startswith("F.") else (f"{x}.{fn}()" if r.random() < 0.3 else f"torch.{fn}({x})")
            return self.run(call, [x], mode)
        if kind < 0.7:
            fn = r.choice(("log", "sqrt", "rsqrt", "reciprocal", "log1p", "asin", "acos", "atanh", "tan", "log2"))
            margin_ok = fn in ("log", "sqrt", "rsqrt", "reciprocal", "log2") and is_float(t) and (
                t.numel() == 0 or t.abs().nan_to_num(1, 1, 1).min() >= 0.05)
            return self.run(f"torch.{fn}({x})", [x], "inexact", needs_exact=not margin_ok)
        fn = r.choice(("floor", "ceil", "round", "trunc", "sign", "isnan", "isinf", "isfinite", "logical_not",
                       "bitwise_not", "frac", "signbit"))
        if fn == "signbit" and is_float(t) and bool(t.isnan().any()):
            raise Reject("the sign bit of a NaN (EXCLUDED)")
        return self.run(f"torch.{fn}({x})", [x], "move", needs_exact=True)

    def broadcastable_partner(self, t):
        """An existing value broadcastable with t, or a new input of a broadcastable shape."""
        r = self.rng
        fits = [n for n in self.usable() if _broadcasts(self.env[n].shape, t.shape)]
        if fits and r.random() < 0.6:
            return r.choice(fits)
        shape = list(t.shape)
        shape = [1 if (s > 1 and r.random() < 0.3) else s for s in shape]
        if shape and r.random() < 0.3:
            shape = shape[r.randint(1, len(shape)):]
        return self.new_input(shape, self.dtype() if r.random() < 0.4 else t.dtype)

    def op_binary(self):
        r = self.rng
        x = self.pick()
        t = self.env[x]
        y = self.broadcastable_partner(t) if r.random() < 0.7 else None
        other = y if y is not None else self.scalar(t)
        operands = [x] + ([y] if y else [])
        if r.random() < 0.5 and y is None and r.random() < 0.5:
            x, other = other, x  # scalar on the left
        kind = r.random()
        if kind < 0.5:
            sym, mode = r.choice((("+", "arith"), ("-", "arith"), ("*", "arith"), ("/", "inexact")))
            if sym == "/" and not all(self.exact[o] for o in operands):
                den = self.env[other] if y else None
                if den is not None and (den.numel() == 0 or den.abs().nan_to_num(1, 1, 1).min() < 0.05):
                    raise Reject("division by an inexact value near 0")
            return self.run(f"{x} {sym} {other}", operands, mode)
        if kind < 0.65:
            fn, mode = r.choice((("torch.maximum", "move"), ("torch.minimum", "move"), ("torch.fmax", "move"),
                                 ("torch.add", "arith"), ("torch.sub", "arith"), ("torch.atan2", "inexact")))
            if fn in ("torch.maximum", "torch.minimum", "torch.fmax", "torch.atan2") and y is None:
                other = f"torch.tensor({self.scalar(exact_only=True)})"
            extra = f", alpha={r.choice((2, -1, 0.5))}" if fn in ("torch.add", "torch.sub") and r.random() < 0.4 \
                and is_float(t) else ""
            needs = fn == "torch.atan2"
            return self.run(f"{fn}({x}, {other}{extra})", operands, mode, needs_exact=needs)
        if kind < 0.85:
            sym = r.choice(("//", "%", "torch.fmod", "torch.remainder", "div_trunc", "div_floor", "**"))
            if sym in ("//", "%"):
                expr = f"{x} {sym} {other}"
            elif sym == "**":
                expo = r.choice(("2", "3", "0.5", "-1", "-2", "1.5")) if r.random() < 0.8 else other
                expr = f"{x} ** {expo}"
                return self.run(expr, operands, "inexact", needs_exact=expo not in ("2", "3"))
            elif sym.startswith("div_"):
                expr = f"torch.div({x}, {other}, rounding_mode='{sym[4:]}')"
            else:
                expr = f"{sym}({x}, {other})"
            return self.run(expr, operands, "move", needs_exact=True)
        sym = r.choice(("==", "!=", "<", "<=", ">", ">=", "&", "|", "^", "torch.logical_and", "torch.logical_or",
                        "torch.logical_xor"))
        expr = f"{sym}({x}, {other})" if sym.startswith("torch") else f"({x} {sym} {other})"
        return self.run(expr, operands, "move", needs_exact=True)

    def op_where(self):
        r = self.rng
        x = self.pick()
        t = self.env[x]
        bools = [n for n in self.usable()
                 if self.env[n].dtype == torch.bool and _broadcasts(self.env[n].shape, t.shape)]
        if bools and r.random() < 0.5:
            cond, operands = r.choice(bools), [x]
        else:
            c = self.pick(lambda u: _broadcasts(u.shape, t.shape) and u.dtype != torch.bool)
            if not self.exact[c]:
                raise Reject("condition on an inexact value")
            cond, operands = f"({c} > {self.scalar(self.env[c], exact_only=True)})", [x, c]
        if r.random() < 0.5:
            y = self.broadcastable_partner(t)
            operands.append(y)
        else:
            y = self.scalar(t, exact_only=r.random() < 0.7)
        args = (x, y) if r.random() < 0.5 else (y, x)
        return self.run(f"torch.where({cond}, {args[0]}, {args[1]})", operands, "move")

    def op_cast(self):
        r = self.rng
        x = self.pick()
        t = self.env[x]
        dtypes = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool] + list(HALF_DTYPES) * self.half
        dtype = r.choice(dtypes)
        if is_float(t) and not dtype.is_floating_point:
            finite = t.numel() == 0 or bool(torch.isfinite(t).all() and t.abs().max() < INT_BOUND)
            if dtype != torch.bool and not finite:
                raise Reject("float -> int cast of NaN/inf/out of range is undefined (EXCLUDED)")
            if not self.exact[x]:
                raise Reject("discontinuous cast of an inexact value")
        form = r.random()
        name = str(dtype).removeprefix("torch.")
        short = {"float32": "float", "float64": "double", "int64": "long", "int32": "int", "bool": "bool",
                 "float16": "half", "bfloat16": "bfloat16"}[name]
        expr = f"{x}.{short}()" if form < 0.4 else f"{x}.to(torch.{name})"
        return self.run(expr, [x], "cast")

    def op_reduce(self):
        r = self.rng
        x = self.pick(lambda u: u.ndim > 0)
        t = self.env[x]
        fn = r.choice(("sum", "sum", "mean", "amax", "amin", "argmax", "argmin", "prod", "var", "std", "any", "all",
                       "max_dim", "min_dim", "logsumexp", "max_all"))
        dims = r.sample(range(t.ndim), r.randint(1, t.ndim))
        dims = [d - t.ndim if r.random() < 0.3 else d for d in dims]
        keep = r.random() < 0.4
        one = dims[0]
        mode, needs, check = "inexact", False, None
        if fn in ("sum", "amax", "amin", "any", "all", "mean", "var", "std", "logsumexp"):
            dim_arg = f"{tuple(dims)}" if len(dims) > 1 or r.random() < 0.5 else str(one)
            if fn in ("amax", "amin") or r.random() < 0.8:
                expr = f"torch.{fn}({x}, {dim_arg}, keepdim={keep})"
            else:
                expr = f"{x}.{fn}()"
            if fn in ("var", "std") and r.random() < 0.5:
                expr = expr.replace("keepdim", f"correction={r.choice((0, 1))}, keepdim")
            mode = {"sum": "arith", "amax": "move", "amin": "move"}.get(fn, "inexact")
            needs = fn in ("any", "all")
            if fn == "sum" and is_float(t) and t.numel() and t.abs().nan_to_num(0, 0, 0).sum() >= SUM_BOUND:
                mode = "inexact"
        elif fn in ("argmax", "argmin"):
            expr = f"torch.{fn}({x}, {one}, keepdim={keep})" if r.random() < 0.8 else f"torch.{fn}({x})"
            needs = True
        elif fn == "prod":
            expr = f"torch.prod({x}, {one}, keepdim={keep})" if r.random() < 0.8 else f"torch.prod({x})"
            extent = t.shape[one] if "keepdim" in expr else t.numel()
            if is_float(t) and extent > 16:
                raise Reject("long float prod (EXCLUDED)")
            mode = "arith"
        elif fn in ("max_dim", "min_dim"):
            which = r.choice((0, 1))
            expr = f"torch.{fn[:3]}({x}, {one}, keepdim={keep})[{which}]"
            mode, needs = "move", which == 1
        else:
            expr = f"{x}.max()" if r.random() < 0.5 else f"{x}.min()"
            mode = "move"
        return self.run(expr, [x], mode, needs_exact=needs, check=check)

    def op_norm(self):
        r = self.rng
        x = self.pick(lambda u: u.ndim > 0 and is_float(u))
        t = self.env[x]
        fn = r.choice(("softmax", "log_softmax", "layer_norm"))
        if fn != "layer_norm":
            dim = r.randrange(-t.ndim, t.ndim)
            form = r.random()
            if form < 0.4:
                return self.run(f"torch.{fn}({x}, {dim})", [x], "inexact")
            if form < 0.8:
                return self.run(f"F.{fn}({x}, dim={dim})", [x], "inexact")
            return self.run(f"{x}.{fn}({dim}, dtype=torch.float64)", [x], "inexact")
        k = r.randint(1, t.ndim)
        shape = tuple(t.shape[t.ndim - k:])
        rows = t.double().flatten(t.ndim - k)
        if not self.exact[x] and t.numel() and float(rows.var(-1, correction=0).nan_to_num(0).min()) < 1e-2:
            # normalizing a near-constant inexact row multiplies its rounding by 1/sqrt(eps) ~ 300
            raise Reject("layer_norm of a near-constant inexact row: ill-conditioned")
        args = [x, str(shape)]
        operands = [x]
        if r.random() < 0.6:
            w = self.new_input(shape, t.dtype, kind="grid")  # inf * a normalized 0 vs 1e-8: NaN or inf
            b = self.new_input(shape, t.dtype, kind="grid") if r.random() < 0.7 else "None"
            args += [w, b]
            operands += [w] + ([b] if b != "None" else [])
        return self.run(f"F.layer_norm({', '.join(args)})", operands, "inexact")

    def op_view(self):
        r = self.rng
        x = self.pick()
        t = self.env[x]
        n = t.ndim
        kind = r.choice(("reshape", "view", "permute", "transpose", "t", "slice", "select", "narrow", "unsqueeze",
                         "squeeze", "flatten", "expand", "movedim", "contiguous", "flip", "chunk", "unbind",
                         "diagonal", "mT", "getitem", "unflatten"))
        if kind in ("reshape", "view"):
            expr = f"{x}.{kind}({_factor(r, t.numel(), t.shape)})"
        elif kind == "permute" and n:
            expr = f"{x}.permute({', '.join(map(str, r.sample(range(n), n)))})"
        elif kind == "transpose" and n:
            expr = f"{x}.transpose({r.randrange(-n, n)}, {r.randrange(n)})"
        elif kind == "t" and n <= 2:
            expr = f"{x}.t()"
        elif kind == "mT" and n >= 2:
            expr = f"{x}.mT"
        elif kind == "slice" and n:
            d = r.randrange(n)
            size = t.shape[d]
            # bounds past either end too (x[-512:], x[2:100]): Python clamps them, symbolic or not
            far = (-512, 100, size + r.randint(1, 5), -size - r.randint(1, 5))
            start = r.choice((r.randint(-size, size), "", r.choice(far)))
            stop = r.choice(("", size, -1, 2, r.choice(far)))
            expr = f"{x}[{':, ' * d}{start}:{stop}:{r.choice((1, 1, 2, 3))}]"
        elif kind in ("select", "unbind") and n:
            d = r.randrange(n)
            if t.shape[d] == 0:
                raise Reject("select in an empty dim")
            i = r.randrange(-t.shape[d], t.shape[d])
            expr = f"{x}.select({d}, {i})" if kind == "select" else f"{x}.unbind({d})[{i}]"
        elif kind == "narrow" and n:
            d = r.randrange(n)
            start = r.randint(0, t.shape[d])
            expr = f"{x}.narrow({d}, {start}, {r.randint(0, t.shape[d] - start)})"
        elif kind == "unsqueeze":
            expr = f"{x}.unsqueeze({r.randint(-n - 1, n)})"
        elif kind == "squeeze":
            ones = [d for d in range(n) if t.shape[d] == 1]
            expr = f"{x}.squeeze({r.choice(ones)})" if ones and r.random() < 0.6 else f"{x}.squeeze()"
        elif kind == "flatten":
            expr = f"{x}.flatten()" if r.random() < 0.4 or n < 2 else f"{x}.flatten({r.randrange(n - 1)}, {n - 1})"
        elif kind == "expand":
            shape = [r.choice((s, 3, 5)) if s == 1 else s for s in t.shape]
            if r.random() < 0.4:
                shape = [r.choice((2, 3))] + shape
            if list(shape) == list(t.shape) and r.random() < 0.5:
                shape = [2] + shape
            expr = f"{x}.expand({', '.join(map(str, shape)) or '()'})"
        elif kind == "movedim" and n:
            expr = f"{x}.movedim({r.randrange(n)}, {r.randrange(n)})"
        elif kind == "contiguous":
            expr = f"{x}.contiguous()"
        elif kind == "flip" and n:
            expr = f"{x}.flip({r.randrange(n)})"
        elif kind == "chunk" and n:
            d = r.randrange(n)
            expr = f"{x}.chunk({r.choice((2, 3))}, {d})[{r.choice((0, -1))}]"
        elif kind == "diagonal" and n >= 2:
            expr = f"{x}.diagonal({r.choice((0, 1, -1))})"
        elif kind == "getitem" and n:
            expr = f"{x}[{r.choice(('None', '...', '0', '-1', '1:', '::2', '..., None', ':, None'))}]"
        elif kind == "unflatten" and n:
            d = r.randrange(n)
            size = t.shape[d]
            a = r.choice([k for k in range(1, max(size, 1) + 1) if size % k == 0] or [1])
            expr = f"{x}.unflatten({d}, ({a}, -1))"
        else:
            raise Reject("view does not apply")
        return self.run(expr, [x], "move")

    def op_cat(self):
        r = self.rng
        x = self.pick(lambda u: u.ndim > 0)
        t = self.env[x]
        stack = r.random() < 0.3
        d = r.randrange(t.ndim + stack)
        parts = [x]
        for _ in range(r.choice((1, 1, 2))):
            if stack:
                fits = [n for n in self.usable() if self.env[n].shape == t.shape]
            else:
                fits = [n for n in self.usable() if self.env[n].ndim == t.ndim and all(
                    a == b for k, (a, b) in enumerate(zip(self.env[n].shape, t.shape)) if k != d)]
            if fits and r.random() < 0.7:
                parts.append(r.choice(fits))
            else:
                shape = list(t.shape)
                if not stack:
                    shape[d] = r.choice((0, 1, 2, 5))
                parts.append(self.new_input(shape, t.dtype if r.random() < 0.7 else self.dtype()))
        fn = "stack" if stack else "cat"
        return self.run(f"torch.{fn}([{', '.join(parts)}], {d})", parts, "move")

    def indexed_operand(self):
        """(name, value, dim, size of dim) of a non-empty value that an index op reads or writes."""
        x = self.pick(lambda u: u.ndim > 0 and u.numel() > 0)
        d = self.rng.randrange(self.env[x].ndim)
        return x, self.env[x], d, self.env[x].shape[d]

    def op_gather(self):
        r = self.rng
        x, t, d, size = self.indexed_operand()
        kind = r.choice(("index_select", "gather", "getitem", "take_along"))
        if kind == "index_select":
            idx = self.new_input((r.choice((1, 3, 7, 0)),), torch.int64, kind="index", high=size)
            return self.run(f"torch.index_select({x}, {d}, {idx})", [x], "move")
        if kind in ("gather", "take_along"):
            shape = [r.randint(1, s) if s else 0 for s in t.shape]
            shape[d] = r.choice((1, 2, 5))
            idx = self.new_input(shape, torch.int64, kind="index", high=size)
            if kind == "gather":
                return self.run(f"torch.gather({x}, {d}, {idx})", [x], "move")
            return self.run(f"torch.take_along_dim({x}, {idx}, {d})", [x], "move")
        shape = r.choice(((4,), (2, 3), ()))
        idx = self.new_input(shape, r.choice(INT_DTYPES), kind="index", low=-size, high=size)
        return self.run(f"{x}[{':, ' * d}{idx}]", [x], "move")

    def op_clamp(self):
        r = self.rng
        x = self.pick(lambda u: u.dtype != torch.bool)
        t = self.env[x]
        lo, hi = sorted(r.sample(GRID_SCALARS, 2))
        form = r.random()
        if form < 0.3:
            return self.run(f"torch.clamp({x}, {lo}, {hi})", [x], "move")
        if form < 0.5:
            return self.run(f"{x}.clamp(min={lo})", [x], "move")
        if form < 0.65:
            return self.run(f"{x}.clamp(max={hi})", [x], "move")
        if form < 0.8:
            return self.run(f"F.hardtanh({x})", [x], "move")
        b = self.broadcastable_partner(t)
        return self.run(f"torch.clamp({x}, min={b})", [x, b], "move")

    def op_inplace(self):
        r = self.rng
        target = self.pick()
        t = self.env[target]
        kind = r.choice(("add_", "mul_", "sub_", "clamp_", "relu_", "neg_", "copy_", "fill_", "zero_", "setitem",
                         "iadd_slice", "masked_fill_", "div_", "abs_", "sigmoid_"))
        operands = [target]
        mode = "move"
        if kind in ("add_", "mul_", "sub_", "div_", "copy_"):
            if r.random() < 0.6:
                y = self.broadcastable_partner(t)
                operands.append(y)
            else:
                y = self.scalar(t)
            if kind == "copy_" and y not in self.names:
                raise Reject("copy_ of a scalar")
            mode = "inexact" if kind == "div_" else "arith" if kind != "copy_" else "move"
            stmt = f"{target}.{kind}({y})"
        elif kind == "clamp_":
            stmt = f"{target}.clamp_(min={r.choice(GRID_SCALARS)})"
        elif kind in ("relu_", "neg_", "zero_", "abs_", "sigmoid_"):
            stmt = f"{target}.{kind}()"
            mode = "inexact" if kind == "sigmoid_" else "move"
        elif kind == "fill_":
            stmt = f"{target}.fill_({self.scalar(t, exact_only=True)})"
        elif kind == "masked_fill_":
            m = self.pick(lambda u: u.dtype == torch.bool and _broadcasts(u.shape, t.shape))
            operands.append(m)
            stmt = f"{target}.masked_fill_({m}, {self.scalar(t, exact_only=True)})"
        elif kind == "setitem" and t.ndim:
            if t.shape[0] == 0:
                raise Reject("setitem into an empty dim")
            return self._statement(f"{target}[{r.randrange(t.shape[0])}] = {self.scalar(t, exact_only=True)}",
                                   target, operands)
        elif kind == "iadd_slice" and t.ndim:
            return self._statement(f"{target}[..., ::2] += {self.scalar(t, exact_only=True)}", target, operands)
        else:
            raise Reject("in-place op does not apply")
        return self.run(stmt, operands, mode, inplace=target)

    def _statement(self, stmt, target, operands):
        """An assignment statement (x[i] = v): run it, then name the target's new value."""
        env = copy.deepcopy(self.env)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(stmt, {"torch": torch, "F": torch.nn.functional}, env)
        except Exception as e:
            raise Reject(str(e)) from None
        if not is_float(env[target]) and env[target].dtype != torch.bool and env[target].numel() and \
                env[target].abs().max() >= INT_BOUND:
            raise Reject("integer overflow risk")
        self.lines.append(stmt)
        self.env = env
        ptr = env[target].untyped_storage().data_ptr()
        smooth = all(self.smooth[o] for o in operands) and is_smooth(stmt)
        for n in self.names:
            if env[n].untyped_storage().data_ptr() == ptr:
                self.exact[n] = self.exact[n] and on_grid(env[n])
                self.smooth[n] = self.smooth[n] and smooth
        return target

    def op_scan_pool(self):
        r = self.rng
        x = self.pick(lambda u: u.ndim > 0)
        t = self.env[x]
        d = r.randrange(-t.ndim, t.ndim)
        kind = r.choice(("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "max_pool", "avg_pool",
                         "adaptive_avg", "adaptive_max"))
        if kind == "cumsum":
            big = is_float(t) and t.numel() and t.abs().nan_to_num(0, 0, 0).sum() >= SUM_BOUND
            return self.run(f"torch.cumsum({x}, {d})", [x], "inexact" if big else "arith")
        if kind == "cumprod":
            if t.shape[d] > 12 or not is_float(t):
                raise Reject("long or integer cumprod (overflow, EXCLUDED)")
            return self.run(f"{x}.cumprod({d})", [x], "inexact")
        if kind == "logcumsumexp":
            return self.run(f"torch.logcumsumexp({x}, {d})", [x], "inexact")
        if kind in ("cummax", "cummin"):
            which = r.choice((0, 1))
            return self.run(f"torch.{kind}({x}, {d})[{which}]", [x], "move", needs_exact=which == 1)
        if t.ndim not in (3, 4) or not is_float(t):
            raise Reject("pooling takes 3-d or 4-d floats")
        k = r.choice((1, 2, 3))
        if kind in ("adaptive_avg", "adaptive_max"):
            out = (r.choice((1, 2, 3, 5)), r.choice((1, 2, 4)))
            fn = "adaptive_avg_pool2d" if kind == "adaptive_avg" else "adaptive_max_pool2d"
            return self.run(f"F.{fn}({x}, {out})", [x], "inexact" if kind == "adaptive_avg" else "move")
        stride, pad, ceil = r.choice((1, 2, k)), r.randint(0, k // 2), r.random() < 0.3
        if kind == "max_pool":
            if r.random() < 0.3:  # the indices: ties decide them, so exact inputs only
                return self.run(f"F.max_pool2d({x}, {k}, {stride}, {pad}, ceil_mode={ceil}, return_indices=True)[1]",
                                [x], "move", needs_exact=True)
            return self.run(f"F.max_pool2d({x}, {k}, {stride}, {pad}, ceil_mode={ceil})", [x], "move")
        include = r.random() < 0.5
        return self.run(f"F.avg_pool2d({x}, {k}, {stride}, {pad}, ceil_mode={ceil}, count_include_pad={include})",
                        [x], "inexact")

    def op_scatter(self):
        r = self.rng
        x, t, d, size = self.indexed_operand()
        kind = r.choice(("scatter_add", "index_add", "index_put", "scatter", "slice_set", "diag_add"))
        if kind in ("scatter_add", "scatter"):
            shape = [r.randint(1, s) if s else 0 for s in t.shape]
            shape[d] = r.randint(1, size)
            src = self.new_input(shape, t.dtype)
            if kind == "scatter":  # distinct targets: with repeats eager's winner is unspecified
                shape = list(shape)
                shape.append(shape.pop(d))
                idx = self.new_input(shape, torch.int64, kind="unique", high=size)
                idx = f"{idx}.movedim(-1, {d})"
                return self.run(f"{x}.scatter({d}, {idx}, {src})", [x, src], "move")
            idx = self.new_input(shape, torch.int64, kind="index", high=size)
            return self.run(f"{x}.scatter_add({d}, {idx}, {src})", [x, src], "arith")
        if kind == "index_add":
            n = r.choice((1, 3, 5))
            idx = self.new_input((n,), torch.int64, kind="index", high=size)
            shape = list(t.shape)
            shape[d] = n
            src = self.new_input(shape, t.dtype)
            return self.run(f"{x}.index_add({d}, {idx}, {src})", [x, src], "arith")
        if kind == "index_put":
            n = r.randint(1, size)
            idx = self.new_input((n,), torch.int64, kind="unique", high=size)
            v = self.new_input(t.shape[1:] if r.random() < 0.5 else (), t.dtype)
            return self.run(f"{x}.index_put(({idx},), {v})", [x, v], "move")
        if kind == "slice_set":
            if t.ndim < 1 or size < 2:
                raise Reject("no slice")
            y = self.new_input(t[..., 1:size:2].shape if d == t.ndim - 1 else (), t.dtype) \
                if r.random() < 0.5 else self.scalar(t, exact_only=True)
            operands = [x] + ([y] if y in self.names else [])
            return self._statement(f"{x}[..., 1::2] = {y}", x, operands) if d == t.ndim - 1 else \
                self._statement(f"{x}[{':, ' * d}1::2] = {y}", x, operands)
        if t.ndim < 2:
            raise Reject("no diagonal")
        return self.run(f"{x}.diagonal().add_({self.scalar(t, exact_only=True)})", [x], "move", inplace=x)

    def op_matmul(self):
        r = self.rng
        x = self.pick(lambda u: u.ndim in (1, 2, 3) and u.dtype in (torch.float32, torch.float64))
        t = self.env[x]
        k = t.shape[-1]
        if t.ndim == 3:
            shape = (t.shape[0], k, r.choice((1, 3, 7)))
        else:
            shape = (k,) if r.random() < 0.3 else (k, r.choice((1, 3, 7, 16)))
        y = self.new_input(shape, t.dtype)
        fn = r.choice(("@", "torch.matmul", "mm"))
        if fn == "mm" and t.ndim == 2 and len(shape) == 2:
            expr = f"torch.mm({x}, {y})"
        elif fn == "@":
            expr = f"{x} @ {y}"
        else:
            expr = f"torch.matmul({x}, {y})"

        name = self.run(expr, [x, y], "inexact")
        a, b = self.env[x], self.env[y]
        # integer-valued operands with small products: every partial sum is exact, in any order
        if self.exact[x] and a.numel() and b.numel() and bool(torch.isfinite(a).all()) and \
                bool((a == a.round()).all() and (b == b.round()).all()) and \
                float((a.double().abs() @ b.double().abs()).max()) < 2 ** 20:
            self.exact[name] = True
        return name

    def op_special(self):
        """A special function of an extreme input (+-1e-30..1e30, subnormals, zeros), compared
        relatively: erf(1e-30) must be 1.13e-30, not 0 (an absolute tolerance would pass it)."""
        r = self.rng
        extremes = [n for n in self.extreme if n in {s.name for s in self.inputs}]
        if extremes and r.random() < 0.6:
            x = r.choice(extremes)
        else:
            x = self.new_input(self.shape(r.choice((1, 1, 2))), r.choice(FLOAT_DTYPES + HALF_DTYPES * self.half),
                               kind="extreme")
        fn = r.choice(SPECIAL_FUNCTIONS)
        if "gelu" in fn and bool(self.env[x].isinf().any()):
            raise Reject("gelu(inf): eager's vector path gives NaN, its scalar path inf (EXCLUDED)")
        name = self.run(fn.format(x=x), [x], "inexact")
        dtype = self.env[name].dtype
        self.tol[name] = (TOLERANCE[dtype][0], torch.finfo(dtype).tiny)  # relative (see the docstring)
        self.extreme.add(name)
        self.must_output.append(name)
        self.special[name] = (fn.format(x=x), x)
        return name

    def op_layout(self):
        """Ops that move values without computing them: roll, repeat, tile, tril/triu, pad,
        repeat_interleave, overlapping windows (unfold), sort/topk values, a boolean mask."""
        r = self.rng
        x = self.pick(lambda u: u.ndim > 0)
        t = self.env[x]
        n, d = t.ndim, r.randrange(t.ndim)
        kind = r.choice(("roll", "repeat", "tile", "tril", "triu", "pad", "pad_mode", "repeat_interleave", "unfold",
                         "sort", "topk", "kthvalue", "masked", "masked_fill", "diff"))
        if kind == "roll":
            return self.run(f"torch.roll({x}, {r.choice((1, -2, 3))}, {d})", [x], "move")
        if kind in ("repeat", "tile"):
            reps = [r.choice((1, 1, 2, 3)) for _ in range(n + r.choice((0, 0, 1)))]
            return self.run(f"{x}.{kind}({tuple(reps)})", [x], "move")
        if kind in ("tril", "triu") and n >= 2:
            return self.run(f"torch.{kind}({x}, {r.choice((0, 0, 1, -1))})", [x], "move")
        if kind == "pad":
            pads = tuple(r.choice((0, 1, 2, -1)) for _ in range(2 * r.randint(1, min(n, 3))))
            return self.run(f"F.pad({x}, {pads}, value={self.scalar(t, exact_only=True)})", [x], "move")
        if kind == "pad_mode" and is_float(t):
            mode = r.choice(("reflect", "replicate", "circular"))
            pads = tuple(r.choice((0, 1, 2)) for _ in range(2 * r.randint(1, min(max(n - 1, 1), 3))))
            return self.run(f"F.pad({x}, {pads}, mode='{mode}')", [x], "move")
        if kind == "repeat_interleave":
            return self.run(f"{x}.repeat_interleave({r.choice((2, 3))}, {d})", [x], "move")
        if kind == "unfold" and t.shape[d] >= 1:
            size = r.randint(1, t.shape[d])
            return self.run(f"{x}.unfold({d}, {size}, {r.choice((1, 2, size))})", [x], "move")
        if kind == "sort":  # values only: equal keys may come in either order, their values may not
            desc = r.random() < 0.5
            expr = f"torch.sort({x}, {d}, descending={desc})[0]" if r.random() < 0.5 else \
                f"{x}.sort({d}, descending={desc}).values"
            return self.run(expr, [x], "move")
        if kind == "topk" and t.shape[d] >= 1:
            return self.run(f"torch.topk({x}, {r.randint(1, t.shape[d])}, {d}, largest={r.random() < 0.6})[0]", [x],
                            "move")
        if kind == "kthvalue" and t.shape[d] >= 1 and t.dtype != torch.bool:
            return self.run(f"torch.kthvalue({x}, {r.randint(1, t.shape[d])}, {d})[0]", [x], "move")
        if kind in ("masked", "masked_fill"):
            m = self.pick(lambda u: u.dtype == torch.bool and _broadcasts(u.shape, t.shape))
            if kind == "masked":  # its size is the mask's count: data-dependent
                return self.run(f"{x}[{m}]" if self.env[m].shape == t.shape else f"{x}.masked_select({m})",
                                [x, m], "move")
            return self.run(f"{x}.masked_fill({m}, {self.scalar(t, exact_only=True)})", [x, m], "move")
        if kind == "diff" and t.dtype != torch.bool:
            return self.run(f"torch.diff({x}, dim={d})", [x], "arith")
        raise Reject("layout op does not apply")

    def op_nn(self):
        """What training code is made of: activations, losses, normalizations, linear layers and
        convolutions, embeddings, norms and distances."""
        r = self.rng
        x = self.pick(lambda u: u.ndim > 0 and u.dtype in FLOAT_DTYPES)
        t = self.env[x]
        kind = r.choice(("act", "act", "glu", "loss", "loss", "lerp", "addcmul", "binary", "normalize", "vector_norm",
                         "cosine", "group_norm", "batch_norm", "linear", "linear", "bmm", "einsum", "conv",
                         "embedding", "interpolate", "cross_entropy"))
        if kind == "act":
            fn = r.choice(("F.leaky_relu({x}, 0.25)", "F.elu({x})", "F.hardswish({x})", "F.hardsigmoid({x})",
                           "F.softplus({x}, beta=2.0)", "F.mish({x})", "F.celu({x})", "F.selu({x})",
                           "F.softsign({x})", "F.logsigmoid({x})", "F.relu6({x})", "F.silu({x})",
                           "F.gelu({x}, approximate='tanh')", "torch.sinc({x})", "F.tanhshrink({x})",
                           "F.softshrink({x}, 0.5)", "F.hardshrink({x}, 0.5)", "torch.special.expit({x})"))
            if "gelu" in fn and bool((t == float("inf")).any()):
                raise Reject("gelu(inf) (EXCLUDED)")
            mode = "arith" if "leaky_relu" in fn else "inexact"
            return self.run(fn.format(x=x), [x], mode, needs_exact="shrink" in fn or "relu6" in fn)
        if kind == "glu":
            d = r.randrange(t.ndim)
            return self.run(f"F.glu({x}, {d})", [x], "inexact")
        if kind == "loss":
            y = self.new_input(t.shape, t.dtype)
            red = r.choice(("mean", "sum", "none"))
            fn = r.choice(("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy_with_logits",
                           "soft_margin_loss"))
            expr = f"F.{fn}({x}, {y}, reduction='{red}')"
            return self.run(expr, [x, y], "inexact", needs_exact=fn in ("l1_loss", "smooth_l1_loss", "huber_loss"))
        if kind == "cross_entropy" and t.ndim == 2 and t.shape[1] >= 1:
            idx = self.new_input((t.shape[0],), torch.int64, kind="index", high=t.shape[1])
            fn = r.choice(("cross_entropy", "nll_loss"))
            arg = x if fn == "cross_entropy" else f"F.log_softmax({x}, 1)"
            extra = r.choice(("", ", reduction='sum'", ", reduction='none'", ", label_smoothing=0.25")) \
                if fn == "cross_entropy" else r.choice(("", ", reduction='none'"))
            return self.run(f"F.{fn}({arg}, {idx}{extra})", [x], "inexact")
        if kind == "lerp":
            y = self.broadcastable_partner(t)
            if self.env[y].dtype != t.dtype:
                raise Reject("lerp takes one dtype")
            return self.run(f"torch.lerp({x}, {y}, {r.choice((0.25, 0.5, 0.75))})", [x, y], "arith")
        if kind == "addcmul":
            y, z = self.broadcastable_partner(t), self.broadcastable_partner(t)
            fn = r.choice(("addcmul", "addcdiv"))
            if fn == "addcdiv" and not (self.exact[z] and bool((self.env[z].abs() >= 0.25).all())):
                raise Reject("division by an inexact value or zero")
            return self.run(f"torch.{fn}({x}, {y}, {z}, value={r.choice((0.5, -2, 1))})", [x, y, z],
                            "arith" if fn == "addcmul" else "inexact")
        if kind == "binary":
            y = self.broadcastable_partner(t)
            fn = r.choice(("hypot", "logaddexp", "xlogy", "copysign", "fmin", "float_power"))
            if fn == "float_power":
                return self.run(f"torch.float_power({x}.abs() + 0.5, 2)", [x], "inexact")
            return self.run(f"torch.{fn}({x}, {y})", [x, y], "move" if fn == "fmin" else "inexact",
                            needs_exact=fn in ("copysign", "xlogy"))
        if kind == "normalize":
            d = r.randrange(t.ndim)
            return self.run(f"F.normalize({x}, dim={d})", [x], "inexact", needs_exact=True)
        if kind == "vector_norm":
            d = r.randrange(t.ndim)
            ord_ = r.choice(("2", "1", "float('inf')", "3"))
            return self.run(f"torch.linalg.vector_norm({x}, {ord_}, dim={d}, keepdim={r.random() < 0.4})", [x],
                            "move" if "inf" in ord_ else "inexact", needs_exact=True)
        if kind == "cosine":
            y = self.broadcastable_partner(t)
            return self.run(f"F.cosine_similarity({x}, {y}, dim={r.randrange(-t.ndim, 0)})", [x, y], "inexact",
                            needs_exact=True)
        if kind in ("group_norm", "batch_norm") and t.ndim >= 2 and t.shape[1] >= 1:
            if not self.exact[x] or (t.numel() and float(t.double().var().nan_to_num(0)) < 1e-2):
                raise Reject("normalizing an inexact or near-constant value: ill-conditioned")
            c = t.shape[1]
            w = self.new_input((c,), t.dtype) if r.random() < 0.6 else "None"
            b = self.new_input((c,), t.dtype) if r.random() < 0.5 else "None"
            operands = [x] + [v for v in (w, b) if v != "None"]
            if kind == "group_norm":
                g = r.choice([k for k in range(1, c + 1) if c % k == 0])
                return self.run(f"F.group_norm({x}, {g}, {w}, {b})", operands, "inexact")
            return self.run(f"F.batch_norm({x}, None, None, {w}, {b}, training=True)", operands, "inexact")
        if kind == "linear":
            k = t.shape[-1]
            w = self.new_input((r.choice((1, 3, 8)), k), t.dtype)
            b = self.new_input((self.env[w].shape[0],), t.dtype) if r.random() < 0.6 else None
            return self.run(f"F.linear({x}, {w}{', ' + b if b else ''})", [x, w] + ([b] if b else []), "inexact")
        if kind == "bmm" and t.ndim == 3:
            y = self.new_input((t.shape[0], t.shape[2], r.choice((1, 2, 5))), t.dtype)
            if r.random() < 0.5:
                return self.run(f"torch.bmm({x}, {y})", [x, y], "inexact")
            z = self.new_input((t.shape[0], t.shape[1], self.env[y].shape[2]), t.dtype)
            return self.run(f"torch.baddbmm({z}, {x}, {y}, beta=0.5, alpha=2)", [x, y, z], "inexact")
        if kind == "einsum" and t.ndim == 2:
            y = self.new_input((t.shape[1], r.choice((1, 3, 4))), t.dtype)
            eq = r.choice(("ij,jk->ik", "ij,jk->ki", "ij,jk->i", "ij,jk->jk"))
            if eq == "ij,jk->jk":
                return self.run(f"torch.einsum('ij,ij->j', {x}, {x})", [x], "inexact")
            return self.run(f"torch.einsum('{eq}', {x}, {y})", [x, y], "inexact")
        if kind == "conv" and t.ndim in (3, 4):
            cin = t.shape[1]
            k = r.choice((1, 2, 3))
            dims = t.ndim - 2
            groups = r.choice([g for g in (1, 2) if cin % g == 0])
            w = self.new_input((r.choice((1, 2, 4)) * groups, cin // groups) + (k,) * dims, t.dtype)
            b = self.new_input((self.env[w].shape[0],), t.dtype) if r.random() < 0.5 else "None"
            fn = "conv1d" if dims == 1 else "conv2d"
            operands = [x, w] + ([b] if b != "None" else [])
            return self.run(f"F.{fn}({x}, {w}, {b}, stride={r.choice((1, 2))}, padding={r.choice((0, 1))}, "
                            f"groups={groups})", operands, "inexact")
        if kind == "embedding" and t.ndim == 2 and t.shape[0] >= 1:
            idx = self.new_input(r.choice(((3,), (2, 4), (5,))), torch.int64, kind="index", high=t.shape[0])
            return self.run(f"F.embedding({idx}, {x})", [x], "move")
        if kind == "interpolate" and t.ndim in (3, 4):
            mode = r.choice(("nearest", "linear" if t.ndim == 3 else "bilinear"))
            extra = ", align_corners=False" if mode != "nearest" else ""
            return self.run(f"F.interpolate({x}, scale_factor=2, mode='{mode}'{extra})", [x],
                            "move" if mode == "nearest" else "inexact")
        raise Reject("nn op does not apply")

    OPS = (("op_unary", 5), ("op_binary", 7), ("op_where", 2), ("op_cast", 2), ("op_reduce", 4), ("op_norm", 1),
           ("op_view", 5), ("op_cat", 1), ("op_gather", 1), ("op_clamp", 1), ("op_inplace", 2), ("op_matmul", 1),
           ("op_scan_pool", 1), ("op_scatter", 1), ("op_special", 1), ("op_layout", 2), ("op_nn", 3))

    def generate(self):
        r = self.rng
        for _ in range(r.choice((1, 1, 2, 3))):
            self.new_input()
        if r.random() < 0.12:  # aliased and overlapping inputs
            try:
                self.new_alias()
            except Reject:
                pass
        target = r.randint(3, 14)
        attempts = 0
        while len(self.lines) < target and attempts < 200:
            attempts += 1
            names, weights = zip(*self.OPS)
            method = r.choices(names, weights)[0]
            try:
                getattr(self, method)()
            except Reject:
                continue
            except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError):
                continue  # a data check of the generator that does not apply to this dtype/shape
        temps = [n for n in self.names if n.startswith(f"{self.prefix}t") and n not in self.extreme]
        outs = temps[-1:] + r.sample(temps[:-1], min(len(temps) - 1, r.choice((0, 0, 1, 2))))
        outs += [n for n in self.must_output if n not in outs]
        if not outs:
            outs = [self.names[-1]]
        smooth = {n for n in outs + [s.name for s in self.inputs] if self.smooth[n]}
        return Program(self.seed, self.inputs, self.lines, [(n, self.tolerance(n)) for n in outs],
                       [self.tolerance(s.name) for s in self.inputs], smooth, self.special)

    def tolerance(self, name):
        """None: equal bits; (0, 0): equal values (the sign of zero is not defined); else (rtol, atol)."""
        if self.exact[name]:
            return None if self.zero_sign[name] else (0, 0)
        return self.tol[name]


def _broadcasts(a, b):
    """Whether shape a broadcasts to shape b (b's shape unchanged)."""
    if len(a) > len(b):
        return False
    return all(x == y or x == 1 for x, y in zip(reversed(a), reversed(b)))


def _factor(r, numel, shape):
    """A random shape with `numel` elements (sometimes with -1)."""
    if numel == 0:
        return "(0, -1)" if r.random() < 0.5 else "(-1,)"
    dims, left = [], numel
    for p in (2, 3, 5, 7, 11, 13):
        while left % p == 0 and r.random() < 0.6:
            dims.append(p)
            left //= p
    dims.append(left)
    r.shuffle(dims)
    merged = []
    for d in dims:
        if merged and r.random() < 0.4:
            merged[-1] *= d
        else:
            merged.append(d)
    if r.random() < 0.3:
        merged.insert(r.randrange(len(merged) + 1), 1)
    if r.random() < 0.3:
        merged[r.randrange(len(merged))] = -1
    return f"({', '.join(map(str, merged))},)"


def program(seed, prefix=""):
    return ProgramGen(seed, prefix).generate()


# ---- running and comparing ----------------------------------------------------------------------

def batch_function(programs, functional=torch.nn.functional):
    """One function running every program's body; returns all outputs, flat. `functional`: the
    module the programs' `F.` names (the reference passes ACCURATE_F)."""
    args = [s.name for p in programs for s in p.inputs]
    body = [f"    {line}" for p in programs for line in p.lines] or ["    pass"]
    outs = [n for p in programs for n, _ in p.outputs]
    src = f"def fuzz_batch({', '.join(args)}):\n" + "\n".join(body) + \
        f"\n    return ({''.join(o + ', ' for o in outs)})\n"
    scope = {"torch": torch, "F": functional}
    exec(compile(src, f"<fuzz batch {programs[0].seed}>", "exec"), scope)
    return scope["fuzz_batch"], src


# how a batch is compiled: "static" (two calls at the program's sizes), "dynamic" (dynamic=True;
# calls at the program's sizes, at other sizes, then at the program's again) or "automatic" (the
# default dynamic=None: a call at other sizes compiles static, the next at the program's sizes
# recompiles with the changed dims symbolic); "mixed" (the default) picks per batch
SHAPES = os.environ.get("KILN_FUZZ_SHAPES", "mixed")
CALLS = {"static": ("same", "same"), "dynamic": ("same", "other", "same"),
         "automatic": ("other", "same", "other", "same")}


def batch_options(seed, shapes=SHAPES):
    """Compiler options for a batch: some batches make every kernel parallel; some skip capture
    (torch.fx.symbolic_trace, then kiln.compiler.compile_fx); "shapes" (see SHAPES) is not a
    compiler option: compile_batch takes it out."""
    r = random.Random(seed * 7919 + 1)
    options = {"debug": True}
    if r.random() < 0.3:
        options["cpp.min_parallel_work"] = 1
        options["cpp.threads"] = 2
    options["shapes"] = shapes if shapes != "mixed" else r.choices(tuple(CALLS), (2, 1, 1))[0]
    if options["shapes"] == "static" and r.random() < 0.25:
        options["fx"] = True
    return options


def compile_batch(fn, inputs, options):
    """kiln.compile(fn), or with options["fx"] kiln's compiler on fn's symbolic_trace."""
    options = dict(options)
    dynamic = {"static": None, "dynamic": True, "automatic": None}[options.pop("shapes", "static")]
    if not options.pop("fx", False):
        return kiln.compile(fn, options=options, dynamic=dynamic)
    from kiln.compiler import compile_fx
    from kiln.config import compiler_options
    try:
        gm = torch.fx.symbolic_trace(fn)
    except TypeError:  # fx proxies take no item assignment (x[i] = v): capture instead
        return kiln.compile(fn, options=options)
    return compile_fx(gm, inputs, compiler_options(options=options))


def check_programs(programs, options):
    """Run `programs` eagerly and compiled; raise AssertionError naming what differs. Each call
    (see CALLS) is at the programs' own sizes ("same": compared as the generator checked them)
    or at other sizes ("other": smooth values compared with a tolerance, the rest by shape)."""
    fn, src = batch_function(programs)
    specs = {"same": [s for p in programs for s in p.inputs]}
    shapes = options.get("shapes", "static")
    if shapes != "static":
        specs["other"] = [s for p in programs for s in resized(p)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager, reference = {}, {}
        for which, call_specs in specs.items():
            eager_in = make_inputs(call_specs)
            eager[which] = (fn(*eager_in), eager_in)
            reference[which] = reference_run(programs, call_specs)
        kiln.reset()
        compiled = None
        for which in CALLS[shapes]:  # later calls run cached compiled code: stale state shows there
            kiln_in = make_inputs(specs[which])
            try:
                compiled = compiled or compile_batch(fn, make_inputs(specs[which]), options)
                actual = compiled(*kiln_in)
            except Exception as e:
                raise AssertionError(f"kiln raised {type(e).__name__} (call at {which} sizes): {e}\n{src}") from e
            expected, eager_in = eager[which]
            compare = compare_all if which == "same" else compare_smooth
            compare(programs, actual, expected, kiln_in, eager_in, src, reference[which])


def reference_run(programs, specs):
    """(outputs, inputs after the call) of `programs` run eagerly on float64 copies of their float
    inputs with ACCURATE_F (the module doc's Reference), program by program: None in place of each
    value of a program that is not valid eager code there (an op that wants operands of one dtype,
    one of them cast to a half in the program), so one such program leaves the others' references."""
    outs, ins, at = [], [], 0
    for p in programs:
        mine, at = specs[at:at + len(p.inputs)], at + len(p.inputs)
        fn, _ = batch_function([p], ACCURATE_F)
        inputs = make_inputs(mine, wide=True)
        try:
            outs += fn(*inputs)
            ins += inputs
        except Exception:  # noqa: BLE001 - any refusal: no reference, the comparison stays strict
            outs += [None] * len(p.outputs)
            ins += [None] * len(mine)
    return outs, ins


def resized(p):
    """Input specs of program `p` at other sizes (each size >= 2 mapped to another, consistently
    across its inputs and index bounds), or its own specs when it is not valid eager code there."""
    r = random.Random(p.seed * 31 + 7)
    sizes = {v for s in p.inputs if s.layout != "alias" for v in (*s.shape, s.high, -s.low) if v >= 2}
    fn, _ = batch_function([p])
    for _attempt in range(3):
        new = {v: max(2, v + r.choice((-3, -2, -1, 1, 2, 3, 5))) for v in sizes}
        specs = [dataclasses.replace(s, shape=tuple(new.get(v, v) for v in s.shape), high=new.get(s.high, s.high),
                                     low=-new.get(-s.low, -s.low)) for s in p.inputs]
        try:
            inputs = make_inputs(specs)
            if any(s.layout != "alias" and tuple(x.shape) != s.shape for s, x in zip(specs, inputs)):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs = fn(*inputs)
        except Exception:  # literal sizes in the program (a view, an expand) that no longer fit
            continue
        if all(o.numel() <= MAX_NUMEL and (is_float(o) or o.dtype == torch.bool or not o.numel()
                                           or o.abs().max() < INT_BOUND) for o in outs):
            return specs
    return p.inputs


def compare_all(programs, actual, expected, kiln_in, eager_in, src, reference=None):
    """Every output and every input's state after the call, kiln's against eager's (a special
    function of an extreme input: against eager's, or closer to the exact value than eager's;
    inexact values: the module doc's Reference)."""
    specs = [s for p in programs for s in p.inputs]
    special = {n: s for p in programs for n, s in p.special.items()}
    inputs = {spec.name: x for spec, x in zip(specs, eager_in)}
    ref_out, ref_in = reference or ([None] * len(expected), [None] * len(eager_in))
    for (name, tol), a, b, r in zip([o for p in programs for o in p.outputs], actual, expected, ref_out):
        if name in special:
            assert_accurate(a, b, tol, *special[name], inputs, f"output {name}", src)
        else:
            assert_same(a, b, tol, f"output {name}", src, r)
    input_tol = [t for p in programs for t in p.input_tolerance]
    for spec, a, b, tol, r in zip(specs, kiln_in, eager_in, input_tol, ref_in):
        assert_same(a, b, tol, f"input {spec.name} after the call", src, r)


def compare_smooth(programs, actual, expected, kiln_in, eager_in, src, reference=None):
    """At sizes the generator did not check: smooth values with their dtype's tolerance (integers
    exactly; the module doc's Reference), every value by dtype and shape."""
    smooth = set().union(*(p.smooth for p in programs))
    names = [n for p in programs for n, _ in p.outputs] + [s.name for p in programs for s in p.inputs]
    tols = [tol for p in programs for _, tol in p.outputs] + [t for p in programs for t in p.input_tolerance]
    refs = [*reference[0], *reference[1]] if reference else [None] * len(names)
    for name, tol, a, b, r in zip(names, tols, [*actual, *kiln_in], [*expected, *eager_in], refs):
        what = f"{name} at other sizes"
        assert isinstance(a, torch.Tensor), f"{what}: not a tensor\n{src}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{what}: {a.dtype}{tuple(a.shape)} != " \
                                                         f"{b.dtype}{tuple(b.shape)}\n{src}"
        if name not in smooth or not (is_float(b) or b.dtype == torch.bool or not b.numel()
                                      or b.abs().max() < INT_BOUND):
            continue
        if is_float(b):
            loose = max(tol or (0, 0), TOLERANCE.get(b.dtype, (0, 0)))
            assert_within(a, b, loose, r, f"{what} (smooth)", src)
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{what} (smooth): {m}\n{src}")


def assert_accurate(actual, expected, tol, expr, x, inputs, what, src):
    """`actual` equals eager's `expected` within `tol`, or where not, is no further from the value
    `expr` has in float64 than 4x eager's distance from it (eager's own special functions lose
    accuracy in places kiln's do not: bfloat16 erf of 1e-30 is 0, float32 cosh(89) overflows)."""
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), f"{what}: dtype or shape\n{src}"
    rtol, atol = tol
    a, b = actual.double(), expected.double()
    close = ((a - b).abs() <= atol + rtol * b.abs()) & b.isfinite() | (a == b) | (a.isnan() & b.isnan())
    if bool(close.all()):
        return
    exact = eval(expr, {"torch": torch, "F": ACCURATE_F}, {x: inputs[x].double()})
    kiln_err, eager_err = (a - exact).abs(), (b - exact).abs().nan_to_num(0, 0, 0)  # eager inf: kiln near exact
    better = (kiln_err <= 4 * eager_err + atol + rtol * exact.abs()) & exact.isfinite() | (a == exact)
    bad = ~(close | better)
    assert not bool(bad.any()), (f"{what} (special function, relative): kiln {a[bad][:4].tolist()}, eager "
                                 f"{b[bad][:4].tolist()}, float64 {exact[bad][:4].tolist()}\n{src}")


def assert_same(actual, expected, tol, what, src, reference=None):
    """kiln's value of an output or input equals eager's: bit for bit when exact (tol None), else
    within `tol` (see assert_within)."""
    exact = tol is None or tol == (0, 0)
    assert isinstance(actual, torch.Tensor), f"{what}: not a tensor\n{src}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}\n{src}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}\n{src}"
    if not exact and expected.is_floating_point():
        assert_within(actual, expected, tol, reference, f"{what} (tolerance)", src)
        return
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"{what} ({'exact' if exact else 'tolerance'}): {m}\n{src}")
    if tol is None and expected.is_floating_point():  # assert_close takes -0.0 == 0.0; 1/x does not
        zeros = expected == 0
        assert torch.equal(actual[zeros].signbit(), expected[zeros].signbit()), f"{what}: sign of zero\n{src}"


def assert_within(actual, expected, tol, reference, what, src):
    """Each float of `actual` within `tol` (rtol, atol) of eager's, or, given the float64 reference
    (the module doc's Reference), no further from it than eager's value is, give or take `tol` (where
    eager's value is inf or NaN and the reference's a number: within `tol` of the reference)."""
    rtol, atol = tol
    a, b = actual.double(), expected.double()
    bad = ~(((a - b).abs() <= atol + rtol * b.abs()) & b.isfinite() | (a == b) | (a.isnan() & b.isnan()))
    if reference is not None and reference.shape == a.shape and bool(bad.any()):
        r = reference.double()
        eager_off = (b - r).abs().nan_to_num(0, 0, 0)  # eager overflowed (inf, NaN): kiln within tol of r
        bad &= ~(((a - r).abs() <= eager_off + atol + rtol * r.abs()) & r.isfinite())
    if bool(bad.any()):
        diff = (a - b).abs()[bad]
        ref = f", float64 reference {reference.double()[bad][:4].tolist()}" if reference is not None else ""
        raise AssertionError(f"{what}: {int(bad.sum())} of {a.numel()} elements differ (rtol {rtol}, atol {atol}; "
                             f"largest difference {diff.max().item():.6g}): kiln {a[bad][:4].tolist()}, "
                             f"eager {b[bad][:4].tolist()}{ref}\n{src}")


def failing_programs(programs, options):
    """The programs of a failing batch that fail on their own: [(program, message)]."""
    out = []
    for p in programs:
        try:
            check_programs([p], options)
        except AssertionError as e:
            out.append((p, str(e)))
    return out


BATCHES = [list(range(SEED0 + k, min(SEED0 + k + BATCH, SEED0 + N_PROGRAMS)))
           for k in range(0, N_PROGRAMS, BATCH)]


@pytest.mark.parametrize("seeds", BATCHES, ids=lambda s: f"seeds{s[0]}-{s[-1]}")
def test_random_programs_match_eager(seeds):
    programs = [program(s, prefix=f"p{s}_") for s in seeds]
    options = batch_options(seeds[0])
    try:
        check_programs(programs, options)
    except AssertionError as batch_error:
        alone = failing_programs(programs, options)
        if not alone:
            raise
        pytest.fail("\n\n".join(f"seed {p.seed} ({options}):\n{msg}" for p, msg in alone[:3]))


# ---- the tester's own rules ----------------------------------------------------------------------

def test_an_in_place_op_reading_what_it_writes_elsewhere_is_not_a_program():
    # seed 30690: `t.sub_(t.unsqueeze(-1).diagonal())` reads t[j, j] after eager's loop wrote it
    # (rows below j) or before (rows above): no compiled order can match that, none should
    t = torch.zeros(5, 5)
    assert reads_what_it_writes_elsewhere(t, t.unsqueeze(-1).diagonal())
    assert reads_what_it_writes_elsewhere(t[:, :2], t[:, 1:3])
    assert not reads_what_it_writes_elsewhere(t, t)         # each element reads only itself
    assert not reads_what_it_writes_elsewhere(t[0], t[1])   # memory it does not write
    assert not reads_what_it_writes_elsewhere(t, torch.zeros(5))


def test_a_value_is_right_where_it_is_no_further_from_the_reference_than_eager():
    eager, reference, tol = torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64), (1e-4, 1e-4)
    assert_within(torch.tensor([1.00001]), eager, tol, reference, "x", "")
    assert_within(torch.tensor([1.0]), torch.tensor([1.01]), tol, reference, "x", "")  # eager is off
    with pytest.raises(AssertionError):
        assert_within(torch.tensor([1.01]), eager, tol, reference, "x", "")
    with pytest.raises(AssertionError):
        assert_within(torch.tensor([1.01]), eager, tol, None, "x", "")
    inf = torch.tensor([math.inf])  # eager overflowed: kiln within tolerance of the reference
    assert_within(torch.tensor([1.00001]), inf, tol, reference, "x", "")
    with pytest.raises(AssertionError):
        assert_within(torch.tensor([1.5]), inf, tol, reference, "x", "")
    with pytest.raises(AssertionError):  # the reference overflowed too: only eager's inf matches
        assert_within(torch.tensor([-math.inf]), inf, tol, inf.double(), "x", "")


def test_an_infinity_is_matched_only_by_itself():
    # |a - inf| <= rtol * inf holds for every a: -inf, or any number, passed for an eager inf
    x = {"a0": torch.tensor([1000.0, 89.0])}  # float32 cosh overflows at both, float64 at 1000 only
    eager, right = torch.tensor([math.inf, math.inf]), torch.tensor([math.inf, math.cosh(89.0)])
    assert_accurate(right, eager, (1e-4, 0), "torch.cosh(a0)", "a0", x, "x", "")
    for wrong in ([-math.inf, right[1]], [1.0, right[1]], [math.inf, 1.0]):
        with pytest.raises(AssertionError):
            assert_accurate(torch.tensor(wrong), eager, (1e-4, 0), "torch.cosh(a0)", "a0", x, "x", "")


def test_a_program_without_a_reference_leaves_the_others_theirs():
    # in one batch with a program that is no valid float64 code (half @ double), a float32 cosh that
    # eager's vectorized kernel overflows (x = 89.4) still has its float64 reference, which kiln's finite value matches
    # (a batch of the random tester, seed 3000384, failed on kiln's right answer)
    no_reference = Program(1, [_grid_input("p1_a0", (2, 2), torch.float32, 1)],
                           ["p1_t0 = p1_a0.half() @ p1_a0"], [("p1_t0", (1e-2, 1e-2))])
    overflow = Program(2, [_grid_input("p2_a0", (64,), torch.float32, 2)],
                       ["p2_t0 = torch.cosh(p2_a0 * 0 + 89.4)"], [("p2_t0", (1e-4, 1e-4))])
    programs = [no_reference, overflow]
    outs, ins = reference_run(programs, [s for p in programs for s in p.inputs])
    assert outs[0] is None and ins[0] is None and outs[1].dtype == torch.float64
    x = make_inputs(overflow.inputs)[0]
    eager, right = torch.cosh(x * 0 + 89.4), torch.cosh(x.double() * 0 + 89.4).float()
    if not torch.isinf(eager).any():  # torch 2.14's vectorized cosh no longer overflows there
        pytest.skip("this torch's float32 cosh(89.4) is finite: no eager overflow to tell apart")
    assert torch.isinf(eager).all() and torch.isfinite(right).all()
    assert_within(right, eager, (1e-4, 1e-4), outs[1], "p2_t0", "")


def _grid_input(name, shape, dtype, seed, layout="contiguous"):
    return InputSpec(name, shape, dtype, layout, "grid", seed)


def test_float16_rounding_amplified_by_layer_norm_is_not_a_mismatch():
    # seed 24269: eager rounds the logsumexp to float16 (kiln's fused kernel keeps it in float) and
    # layer_norm multiplies that rounding by weight / std: 0.015 apart, kiln the closer to float64
    p = Program(24269, [_grid_input("a0", (16, 4, 4), torch.float16, 650045460, "offset"),
                        _grid_input("a1", (4, 4), torch.float16, 472260007)],
                ["t0 = torch.logsumexp(a0.contiguous(), 0).transpose(-2, 0)",
                 "t1 = F.layer_norm(t0, (4, 4), a1, None)"], [("t1", (1e-2, 1e-2))], [(1e-2, 1e-2)] * 2)
    check_programs([p], {"debug": True, "shapes": "static"})


def test_gelu_that_eager_cancels_is_not_a_mismatch():
    # seed 30868: eager's float32 gelu(x) is 0 for x < -5.5 (1 + erf(x/sqrt2) cancels), kiln's is
    # right; -0.5 / gelu(x)**2 turns that into -inf against a finite value
    p = Program(30868, [_grid_input("a0", (64,), torch.float32, 754696596)],
                ["t0 = F.gelu(a0 * 2)", "t1 = -0.5 / t0 ** 2"], [("t0", (1e-4, 1e-4)), ("t1", (1e-4, 1e-4))],
                [(1e-4, 1e-4)])
    check_programs([p], {"debug": True, "shapes": "static"})


# ---- minimizing (python -m tests.compiler.test_fuzz_programs SEED [options as key=value]) -------

def minimize(p, options):
    """Drop statements and outputs while the program still fails (greedy, to a fixpoint)."""
    def fails(candidate):
        fn, _ = batch_function([candidate])
        try:
            fn(*make_inputs(candidate.inputs))
        except Exception:
            return False  # no longer valid eager code
        try:
            check_programs([candidate], options)
        except AssertionError:
            return True
        return False
    changed = True
    while changed:
        changed = False
        for k in range(len(p.outputs)):
            if len(p.outputs) > 1:
                c = dataclasses.replace(p, outputs=p.outputs[:k] + p.outputs[k + 1:])
                if fails(c):
                    p, changed = c, True
                    break
        for k in reversed(range(len(p.lines))):
            c = dataclasses.replace(p, lines=p.lines[:k] + p.lines[k + 1:])
            if fails(c):
                p, changed = c, True
                break
    return p


if __name__ == "__main__":
    seed = int(sys.argv[1])
    opts = batch_options(seed)
    for kv in sys.argv[2:]:
        k, v = kv.split("=")
        opts[k] = eval(v)
    prog = program(seed)
    print(prog.function_source(), [str(s) for s in prog.inputs], prog.outputs, opts, sep="\n")
    try:
        check_programs([prog], opts)
        print("passes")
    except AssertionError as e:
        print("FAILS:", str(e)[:3000])
        small = minimize(prog, opts)
        print("minimized:\n" + small.function_source(), *small.inputs, small.outputs, sep="\n")
