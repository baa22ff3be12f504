"""kiln's loop IR.

Three ideas, kept small:

- `Expr`: one scalar expression node (op, args, dtype). Codegen prints it as C++. Loads name a
  buffer and carry a sympy flat index; `index` turns a sympy expression into a value.
- `TensorValue`: a tensor as sizes + dtype + `loader(index) -> Expr`. Pointwise math composes
  loaders, so nothing is computed until a value is *realized* into a buffer. A value that is a
  plain strided view of a buffer also carries `view`, so further views stay index maps and
  externs can take it with `as_strided` (no copy).
- Buffers: `InputBuffer` (a graph input), `ComputedBuffer` (a `Pointwise` or `Reduction` loop),
  `ExternBuffer` (the result of an aten call made from the wrapper).

Sizes and indices are sympy expressions throughout, so symbolic sizes need no rewrite.
"""
import contextlib
import contextvars
import dataclasses
from typing import Callable, Optional

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

# dtypes computed in float inside kernels (loaded and stored with a conversion)
HALF_DTYPES = (torch.float16, torch.bfloat16)
# dtypes generated kernels read and write; ops on other dtypes run through aten
KERNEL_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                 torch.bool) + HALF_DTYPES
CPU = torch.device("cpu")


class Expr:
    """A scalar expression node: `op` applied to `args`, producing a `dtype` value.

    Leaves: ("const", (python_value,)) and ("index", (sympy_expr,)). A load is
    ("load", (buffer_name, sympy_index, bindings)) where bindings are (symbol, Expr) pairs for
    the *indirect* symbols in the index (gather, embedding: an index read from a tensor).
    A value of a half dtype is held in float, rounded to that dtype.
    """
    __slots__ = ("op", "args", "dtype")

    def __init__(self, op, args, dtype):
        self.op, self.args, self.dtype = op, tuple(args), dtype

    def __repr__(self):
        inner = ", ".join(repr(a) for a in self.args)
        return f"{self.op}[{str(self.dtype).replace('torch.', '')}]({inner})"

    def children(self):
        if self.op == "load":
            return [e for _, e in self.args[2]]
        return [a for a in self.args if isinstance(a, Expr)]

    def walk(self):
        """Every node of the DAG once."""
        seen, stack = set(), [self]
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            yield e
            stack.extend(e.children())

    def loads(self):
        return [e for e in self.walk() if e.op == "load"]

    def op_count(self):
        return sum(1 for e in self.walk() if e.op not in ("load", "const", "index"))

    def cost(self):
        """Rough compute cost: transcendental functions weigh like several arithmetic ops."""
        return sum(EXPENSIVE_OPS.get(e.op, 1) for e in self.walk() if e.op not in ("load", "const", "index"))


EXPENSIVE_OPS = {name: 8 for name in (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "sigmoid", "pow", "atan2", "lgamma")}
EXPENSIVE_OPS.update(truediv=2, sqrt=2, rsqrt=2)


# indirect index symbols (an index read from a tensor) -> the Expr that computes them: one table per
# graph compile (`indirect_scope`), so it is freed with the compile and a graph's symbols are numbered
# the same in every compile (the same kernel source, the same cached library)
_INDIRECT_TABLE = contextvars.ContextVar("kiln_indirect_table", default=None)
_UNSCOPED = {}  # lowerings used outside a compile (tests)


def _indirect_table():
    table = _INDIRECT_TABLE.get()
    return _UNSCOPED if table is None else table


@contextlib.contextmanager
def indirect_scope():
    token = _INDIRECT_TABLE.set({})
    try:
        yield
    finally:
        _INDIRECT_TABLE.reset(token)


def indirect(value):
    """A sympy symbol standing for the int64 Expr `value` inside an index."""
    table = _indirect_table()
    sym = sympy.Symbol(f"ind{len(table)}", integer=True)
    table[sym] = value
    return sym


def const(value, dtype):
    return Expr("const", (value,), dtype)


def load(name, index, dtype):
    index = sympy.expand(index)
    table = _indirect_table()
    bindings = tuple((s, table[s]) for s in sorted(index.free_symbols, key=str) if s in table)
    return Expr("load", (name, index, bindings), dtype)


def index_expr(expr, dtype=torch.int64):
    if any(s in _indirect_table() for s in getattr(expr, "free_symbols", ())):
        return cast(_indirect_value(sympy.expand(expr)), dtype)
    return Expr("index", (expr,), dtype)


_INDEX_OPS = ((sympy.Add, "add"), (sympy.Mul, "mul"), (sympy.Min, "minimum"), (sympy.Max, "maximum"),
              (sympy.Mod, "remainder"))


def _indirect_value(e):
    """An int64 Expr computing index `e` whose indirect symbols are replaced by the Exprs they stand
    for: an "index" leaf cannot carry them (only loads bind indirect symbols), e.g. cat's bounds
    test on a position that gather read from a tensor."""
    table = _indirect_table()
    if not any(s in table for s in e.free_symbols):
        return Expr("index", (e,), torch.int64)
    if e in table:
        return cast(table[e], torch.int64)
    for kind, name in _INDEX_OPS:
        if isinstance(e, kind):
            out = _indirect_value(e.args[0])
            for a in e.args[1:]:
                out = Expr(name, (out, _indirect_value(a)), torch.int64)
            return out
    raise NotImplementedError(f"index expression over an indirect index: {e}")


def cast(e, dtype):
    """Convert `e` to `dtype` (to a half dtype: round, the value stays in float)."""
    if e.dtype == dtype:
        return e
    if dtype in HALF_DTYPES:
        return Expr("round_to", (cast(e, torch.float32),), dtype)
    return Expr("cast", (e,), dtype)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the elements of a buffer live: element i lives at offset + sum(i_k * strides_k)."""
    sizes: tuple
    strides: tuple
    dtype: torch.dtype
    offset: sympy.Expr = sympy.Integer(0)
    device: torch.device = CPU  # where the memory is: its kernels run through that device's backend

    def index(self, idx):
        return self.offset + sum((i * s for i, s in zip(idx, self.strides)), sympy.Integer(0))

    @property
    def numel(self):
        return sympy_product(self.sizes)


def size_expr(s):
    """A size, stride or SymInt as sympy: ints become Integers, SymInts their ShapeEnv expression
    (over symbols s0, s1, ... that the wrapper binds from the inputs at each call).

    An expression the guards pin to one value is that value: `y[..., 1::2]` has size s1//2, and
    when the trace broadcast it against another size it guarded s1//2 == 1; the IR must see the 1,
    or it would index the dim instead of broadcasting it."""
    if isinstance(s, torch.SymInt):
        expr = sympy.sympify(s.node.expr)
        if not expr.is_Symbol and not expr.is_number:
            hint = s.node.hint
            if hint is not None and statically_known_true(s == hint):
                return sympy.Integer(int(hint))
        return expr
    return sympy.Integer(int(s))


# stands in for every size symbol where only an order of sizes is needed (symbols are >= 2):
# products of more symbols come out larger; whatever the order picks is checked exactly afterwards
SYMBOL_HINT = 8191


def size_hint(e):
    """A number for ordering size expressions (never for deciding a result). Its magnitude: a size
    like 11 - s0 (a slice's length, s0 <= 11 by a guard) is small but comes out negative, and
    products of sizes must order by their factors."""
    e = sympy.sympify(e)
    if e.is_number:
        return e
    return abs(e.xreplace({s: sympy.Integer(SYMBOL_HINT) for s in e.free_symbols}))


def is_symbolic(e):
    return isinstance(e, sympy.Basic) and not e.is_number


def is_dense(layout):
    """Whether a static layout's elements fill its memory exactly once (a permutation of
    contiguous strides, size-1 dims aside)."""
    dims = sorted((int(st), int(sz)) for sz, st in zip(layout.sizes, layout.strides) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def contiguous_strides(sizes):
    strides, acc = [], sympy.Integer(1)
    for s in reversed(sizes):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def sympy_product(xs):
    out = sympy.Integer(1)
    for x in xs:
        out = out * x
    return out


@dataclasses.dataclass(frozen=True)
class StridedView:
    """A TensorValue that reads buffer `name` through `layout` with no computation."""
    name: str
    layout: Layout


@dataclasses.dataclass
class TensorValue:
    sizes: tuple
    dtype: torch.dtype
    loader: Callable  # index (tuple of sympy) -> Expr
    view: Optional[StridedView] = None
    # the strides eager gives this value (its node's fake tensor), when they are not contiguous:
    # what it is laid out with if it is realized (a channels-last convolution's epilogue)
    strides: Optional[tuple] = None
    # the device of the node whose value this is (None: the node being lowered): where it is
    # computed if it is realized (an extern on another device, `.to("cuda")`, realizes its argument)
    device: Optional[torch.device] = None

    @property
    def ndim(self):
        return len(self.sizes)

    @property
    def numel(self):
        return sympy_product(self.sizes)


def view_value(name, layout):
    """The TensorValue that reads `name` through `layout`."""
    dtype = layout.dtype
    return TensorValue(tuple(layout.sizes), dtype, lambda idx: load(name, layout.index(idx), dtype),
                       StridedView(name, layout))


@dataclasses.dataclass
class Pointwise:
    ranges: tuple
    inner_fn: Callable  # index -> Expr


REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "window_argmax", "welford_m2")
# welford_m2: the sum of squared deviations from the row's own mean in one pass over the row (Welford's
# update), lowered only for devices whose backend says `one_pass_variance` (the others get two passes)
# reductions whose result is a position in the reduction loop. window_argmax is max pooling's:
# the first value above every earlier one (from -inf), or the last NaN; -1 when none is
ARG_REDUCTIONS = ("argmax", "argmin", "window_argmax")


@dataclasses.dataclass
class Reduction:
    ranges: tuple
    reduction_ranges: tuple
    reduction_type: str
    inner_fn: Callable  # (index, reduction_index) -> Expr


# scan kinds: running sum/prod/logsumexp/max/min, and the index of the running max/min (eager's
# cummax/cummin: a later equal value or any NaN takes the index)
SCAN_TYPES = ("sum", "prod", "logsumexp", "max", "min", "argmax", "argmin")


@dataclasses.dataclass
class Scan:
    """out[..., i, ...] = the `scan_type` of inner_fn over [..., 0..i, ...] along `dim`, accumulated
    in `acc_dtype` (eager's: double for float32 sums). Runs sequentially along `dim`."""
    ranges: tuple
    dim: int
    scan_type: str
    inner_fn: Callable  # index -> Expr
    acc_dtype: torch.dtype


# how a scatter combines a value with the element it hits (None: a plain store, the last wins)
SCATTER_MODES = (None, "sum", "prod", "max", "min")


@dataclasses.dataclass
class Scatter:
    """out = init_fn over `ranges`; then for each point p of `source_ranges`, in row-major order:
    out[target_fn(p)] = combine(out[...], value_fn(p)). target_fn gives one position per out dim:
    a sympy index or an int64 Expr read from data, bounds-checked when the kernel runs (an
    out-of-range index writes nothing and raises in the wrapper, as eager raises).
    With include_self=False an element that is hit starts from the mode's identity.
    Two points may hit one element only if they differ in `serial_dims` alone: those dims run in
    order, the others in parallel."""
    ranges: tuple
    init_fn: Callable          # out index -> Expr
    source_ranges: tuple
    target_fn: Callable        # source index -> tuple of (sympy expr | int64 Expr)
    value_fn: Callable         # source index -> Expr
    mode: Optional[str]
    include_self: bool
    serial_dims: tuple


@dataclasses.dataclass
class Buffer:
    name: str
    layout: Layout


@dataclasses.dataclass
class InputBuffer(Buffer):
    position: int  # which graph input


@dataclasses.dataclass
class ConstantBuffer(Buffer):
    value: torch.Tensor  # a module tensor the graph reads (get_attr): held by reference


@dataclasses.dataclass
class ComputedBuffer(Buffer):
    data: object  # Pointwise | Reduction | Scan | Scatter


@dataclasses.dataclass
class ExternCall:
    """An aten call made from the wrapper: `target(*args, **kwargs)` where tensors in args are
    `BufferArg`s, returning results bound to `outputs` (buffer names, pytree-shaped like the
    op's result with None where a result is not a tensor we keep)."""
    name: str
    target: object
    args: tuple
    kwargs: dict
    outputs: object


@dataclasses.dataclass(frozen=True)
class BufferArg:
    """A tensor argument of an extern call: buffer `name` seen through `layout`
    (as_strided when the layout is not the buffer's own)."""
    name: str
    layout: Optional[Layout]


@dataclasses.dataclass
class ExternBuffer(Buffer):
    call: ExternCall
