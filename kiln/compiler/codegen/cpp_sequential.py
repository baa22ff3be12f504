"""C++ for the kernels that run in order along some dims: Scan and Scatter (see schedule_sequential).

A scan keeps one accumulator per outer point and walks the scan dim in order, storing the
running value at every step (outer points split among threads). A scatter first copies its
initial value over the whole output (parallel), then walks the source points: dims where two
points may hit one element run in order (so the last write wins, as in eager's CPU kernels), the
others in parallel. A data-dependent position out of range writes nothing and records the failure
(codegen/cpp_memory); the wrapper raises (eager raises there too).
"""
import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from kiln.compiler import ir
from kiln.compiler.codegen.cpp_exprs import CTYPES, ExprPrinter, cindex, compute_ctype, reduction_init
from kiln.compiler.codegen.cpp_memory import ERROR_FLAG
from kiln.compiler.loop_nodes import loop_var
from kiln.compiler.schedule_sequential import ScanPlan, position_symbol


def write_sequential(writer):
    """The C++ lines of `writer.kernel` (a KernelWriter holding one Scan or Scatter node)."""
    node = writer.kernel.nodes[0]
    plan = node.sequential
    kind = f"scan {plan.scan_type}" if isinstance(plan, ScanPlan) else f"scatter {plan.mode or 'store'}"
    lines = [f"  // {writer.kernel.name}: {node.name}={kind}", "  {"]
    lines += writer.pointer_lines()
    lines += _scan(writer, node) if isinstance(plan, ScanPlan) else _scatter(writer, node)
    lines.append("  }")
    return lines


def _parallel(writer, work, outer_count):
    """The OpenMP clauses for loops with `work` points in all, `outer_count` of them split among
    threads, or None when threads do not pay (symbolic sizes: decided when the kernel runs)."""
    if outer_count == 1 or writer.threads < 2:
        return None
    if not work.is_number:
        return f" num_threads({writer.threads}) if({cindex(sympy.expand(work))} >= {writer.min_work})"
    return f" num_threads({writer.threads})" if int(work) >= writer.min_work else None


def _loops(names, sizes, body, indent, parallel_count=0, clauses=None):
    """for-loops over `names` (outermost first), the first `parallel_count` split among threads
    (with `clauses`); `body` is indented for the innermost level."""
    lines = []
    for k, (v, s) in enumerate(zip(names, sizes)):
        pad = "  " * (indent + k)
        if k == 0 and parallel_count and clauses is not None:
            lines.append(f"{pad}#pragma omp parallel for{_collapse(parallel_count)}{clauses}")
        lines.append(f"{pad}for (int64_t {v} = 0; {v} < {cindex(s)}; ++{v}) {{")
    lines += body
    for k in reversed(range(len(names))):
        lines.append("  " * (indent + k) + "}")
    return lines


def _store(dtype, value):
    """C++ for `value` (a compute-type expression) converted to `dtype`'s storage type."""
    if dtype == torch.float16:
        return f"(_Float16)(float)({value})"
    if dtype == torch.bfloat16:
        return f"kiln_bf16_store((float)({value}))"
    return f"({CTYPES[dtype]})({value})"


# ---- scan ---------------------------------------------------------------------------------------

def _scan_update(kind, acc, acc_i, v, t, tmp):
    """Lines updating accumulator `acc` (and index `acc_i`) of C++ type t with value `v` at scan
    position r0; `tmp` prefixes the temporaries."""
    if kind == "sum":
        return [f"{acc} = {acc} + ({t}){v};"]
    if kind == "prod":
        return [f"{acc} = {acc} * ({t}){v};"]
    x, lo, hi = f"x_{tmp}", f"lo_{tmp}", f"hi_{tmp}"
    if kind == "logsumexp":  # eager's _log_add_exp_helper(v, acc), NaN and infinities included
        return [f"{t} {x} = ({t}){v};",
                f"{t} {lo} = {acc} != {acc} ? {acc} : std::min<{t}>({x}, {acc});",
                f"{t} {hi} = {acc} != {acc} ? {acc} : std::max<{t}>({x}, {acc});",
                f"{acc} = ({lo} != {hi} || std::isfinite({lo})) ? std::log1p(std::exp({lo} - {hi})) + {hi} : {x};"]
    # cummax/cummin: a NaN, or a value at least as large (small), takes over, as in eager
    better = ">=" if kind in ("max", "argmax") else "<="
    return [f"{t} {x} = ({t}){v};",
            f"if (r0 == 0 || {x} != {x} || ({acc} == {acc} && {x} {better} {acc})) {{ {acc} = {x}; {acc_i} = r0; }}"]


SCAN_INIT = {"sum": "0", "prod": "1", "logsumexp": "-std::numeric_limits<{t}>::infinity()"}
# a scan along any dim but the last walks a block of this many elements of the last dim at once
# (one accumulator each): the vector loop runs over contiguous memory, not along the scan's stride
SCAN_BLOCK = 64


def _scan_step(writer, node, indent, acc, acc_i):
    """The body of one scan step (position r0): the value, the update, the store."""
    plan = node.sequential
    lines = []
    value = ExprPrinter(lines, indent, writer.memory, {}).expr(node.body)
    t = compute_ctype(plan.acc_dtype)
    lines += ["  " * indent + line for line in _scan_update(plan.scan_type, acc, acc_i, value, t, node.name)]
    result = acc_i if plan.scan_type in ("argmax", "argmin") else acc
    lines.append("  " * indent + writer.memory.store(node.name, cindex(node.store_index),
                                                      _store(node.layout.dtype, result)))
    return lines


def _scan(writer, node):
    plan = node.sequential
    names = [loop_var("x", k).name for k in range(len(node.sizes))]
    t = compute_ctype(plan.acc_dtype)
    init = SCAN_INIT.get(plan.scan_type, "0").format(t=t)
    acc = f"acc_{node.name}"
    clauses = _parallel(writer, node.numel * node.rnumel, node.numel)
    if plan.along_last or not names:
        indent = 2 + len(names)
        body = ["  " * indent + f"{t} {acc} = {init}; int64_t {acc}_i = 0; (void){acc}_i;"]
        body += _loops(["r0"], node.reduction_sizes, _scan_step(writer, node, indent + 1, acc, f"{acc}_i"), indent)
        return _loops(names, node.sizes, body, 2, len(names), clauses)
    lane, width = names[-1], node.sizes[-1]
    block = f"b_{node.name}"
    indent = 2 + len(names)
    pad = "  " * indent
    body = [f"{pad}const int64_t lo_{block} = {block} * {SCAN_BLOCK};",
            f"{pad}const int64_t hi_{block} = std::min<int64_t>(lo_{block} + {SCAN_BLOCK}, {cindex(width)});",
            f"{pad}{t} {acc}[{SCAN_BLOCK}]; int64_t {acc}_i[{SCAN_BLOCK}]; (void){acc}_i;",
            f"{pad}for (int64_t k = 0; k < {SCAN_BLOCK}; ++k) {{ {acc}[k] = {init}; {acc}_i[k] = 0; }}"]
    at = f"[{lane} - lo_{block}]"
    step = _scan_step(writer, node, indent + 2, acc + at, f"{acc}_i{at}")
    lanes = ["  " * (indent + 1) + "#pragma omp simd",
             "  " * (indent + 1) + f"for (int64_t {lane} = lo_{block}; {lane} < hi_{block}; ++{lane}) {{"]
    body += _loops(["r0"], node.reduction_sizes, lanes + step + ["  " * (indent + 1) + "}"], indent)
    blocks = FloorDiv(width + SCAN_BLOCK - 1, SCAN_BLOCK)
    return _loops(names[:-1] + [block], list(node.sizes[:-1]) + [blocks], body, 2, len(names), clauses)


# ---- scatter ------------------------------------------------------------------------------------

def _scatter(writer, node):
    dtype = node.layout.dtype
    if dtype in ir.HALF_DTYPES:
        raise NotImplementedError("scatter into a half dtype")  # lowerings decline these
    outer = [loop_var("x", k) for k in range(len(node.sizes))]
    indent = 2 + len(outer)
    init_lines = []
    printer = ExprPrinter(init_lines, indent, writer.memory, {})
    init_lines.append("  " * indent + writer.memory.store(node.name, cindex(node.store_index),
                                                           _store(dtype, printer.expr(node.body))))
    clauses = _parallel(writer, node.numel, node.numel)
    lines = _loops([v.name for v in outer], node.sizes, init_lines, 2, len(outer), clauses)
    return lines + _scatter_loops(writer, node)


def _scatter_loops(writer, node):
    plan = node.sequential
    names = [f"q{k}" for k in range(len(plan.source_sizes))]  # not s*: the size symbols
    par = [names[d] for d in plan.parallel]
    ser = [names[d] for d in plan.serial]
    par_sizes = [plan.source_sizes[d] for d in plan.parallel]
    ser_sizes = [plan.source_sizes[d] for d in plan.serial]
    clauses = _parallel(writer, ir.sympy_product(plan.source_sizes), ir.sympy_product(par_sizes))
    passes = [True, False] if not plan.include_self else [False]  # identity pass first, then the values
    if par and ser and max(plan.serial) < min(plan.parallel):
        return _serial_outer(writer, node, passes, ser, ser_sizes, par, par_sizes, clauses)
    body = []
    for identity in passes:
        point = _scatter_point(writer, node, 2 + len(par) + len(ser), identity)
        body += _loops(ser, ser_sizes, point, 2 + len(par))
    return _loops(par, par_sizes, body, 2, len(par), clauses)


def _serial_outer(writer, node, passes, ser, ser_sizes, par, par_sizes, clauses):
    """The serial dims come first in memory (index_put's index dims, e.g. an embedding's
    gradient): walk them outermost, each thread taking the same static chunk of the parallel dims
    at every step, so an element is only ever touched by one thread, in order."""
    if clauses is None:
        body = []
        for identity in passes:
            point = _scatter_point(writer, node, 2 + len(ser) + len(par), identity)
            body += _loops(ser, ser_sizes, _loops(par, par_sizes, point, 2 + len(ser)), 2)
        return body
    indent = 3
    lines = [f"    #pragma omp parallel{clauses}", "    {"]
    for identity in passes:
        point = _scatter_point(writer, node, indent + len(ser) + len(par), identity)
        inner = _loops(par, par_sizes, point, indent + len(ser))
        pragma = "  " * (indent + len(ser)) + f"#pragma omp for{_collapse(len(par))} schedule(static) nowait"
        lines += _loops(ser, ser_sizes, [pragma] + inner, indent)
    return lines + ["    }"]


def _collapse(n):
    return f" collapse({n})" if n > 1 else ""


def _scatter_point(writer, node, indent, identity):
    """Lines for one source point: check its positions, then store (or combine) at the target;
    with `identity`, store the mode's identity instead (include_self=False's first pass)."""
    plan = node.sequential
    pad = "  " * (indent + 1)
    lines = ["  " * indent + "do {"]
    printer = ExprPrinter(lines, indent + 1, writer.memory, {})
    bound = {}
    for k, (position, size) in enumerate(zip(plan.positions, plan.out_sizes)):
        if isinstance(position, ir.Expr):
            name = f"p{k}_{node.name}"
            lines.append(f"{pad}const int64_t {name} = (int64_t){printer.expr(position)};")
            code = writer.memory.index_site(f"a scatter into dimension {k}")
            lines.append(f"{pad}if (!kiln_in_bounds({name}, {cindex(size)}, {ERROR_FLAG}, {code})) break;")
            bound[position_symbol(k)] = sympy.Symbol(name, integer=True)
    target = cindex(plan.target_index.xreplace(bound))
    ctype = CTYPES[node.layout.dtype]
    if identity:
        lines.append(pad + writer.memory.store(node.name, target, reduction_init(plan.mode, ctype)))
    else:
        value = printer.expr(plan.value)
        lines.append(pad + writer.memory.store(node.name, target, lambda old: _combine(plan.mode, old, value, ctype)))
    lines.append("  " * indent + "} while (0);")
    return lines


def _combine(mode, target, value, ctype):
    v = f"({ctype})({value})"
    if mode is None:
        return v
    if mode in ("max", "min"):
        return f"kiln_{mode}<{ctype}>({target}, {v})"
    return f"({ctype})({target} {'+' if mode == 'sum' else '*'} {v})"
