"""Reductions over a leading dim (`x.sum(0)`, bias and norm-weight gradients, `amax(0)`) as C++.

The usual reduction loop nest keeps one accumulator per output point and walks the reduced dim
innermost. When the reduced dim is not the contiguous one, that inner loop strides through memory
a row at a time and cannot vectorize (512x1024 `sum(0)`: 30x slower than eager). Here the loops
are interchanged: the last output dim is cut into blocks of BLOCK points, each block keeps an array
of accumulators, and the reduction loop runs outside a vectorized loop over the block, so every
load is contiguous. Each output point still sees its values in the same order as before, so
results do not change.

Used for a kernel whose first stage is one reduction loop (reductions and the pointwise values
that feed them) followed only by per-output-point work (a mean's division, an epilogue), when a
most loads walk memory along the last output dim rather than the reduced one.
"""
import sympy

from kiln.compiler import ir
from kiln.compiler.codegen.cpp_exprs import ExprPrinter, cindex, compute_ctype, reduction_init, simd_reduction_op

BLOCK = 64     # output points per block: accumulators stay in L1, the inner loop is long enough to vectorize
MIN_COLUMNS = 8


def fits(writer, stages):
    """Whether `writer`'s kernel is a leading-dim reduction this module writes better."""
    k = writer.kernel
    if writer.rows or not writer.outer or not writer.inner or writer.split_reduction:
        return False
    first, rest = stages[0], stages[1:]
    if k.role(first[0]) == "outer" or any(k.role(n) != "outer" for stage in rest for n in stage):
        return False
    reductions = [n for n in first if n.is_reduction]
    if not reductions or any(n.reduction_type in ir.ARG_REDUCTIONS for n in reductions):
        return False
    if any(simd_reduction_op(n.reduction_type, compute_ctype(n.body.dtype)) is None for n in reductions):
        return False
    columns = writer.outer[-1]
    if columns.is_number and int(columns) < MIN_COLUMNS:
        return False
    return _walks_columns(writer, first)


def _walks_columns(writer, stage):
    """Whether more loads walk memory along the last output dim than along the last reduced dim
    (a load favours the dim with the smaller stride)."""
    x, r = writer.outer_vars[-1], writer.inner_vars[-1]
    score = 0
    for node in stage:
        for load in node.body.loads():
            if load.args[2]:  # an index read from a tensor: keep the plain loop
                return False
            index = sympy.expand(load.args[1].xreplace(writer.maps[node.name]))
            score += _favours_columns(index.coeff(x), index.coeff(r))
    return score > 0


def _favours_columns(x_stride, r_stride):
    """+1 if a load with these strides is better walked along x, -1 along r, 0 if no matter (a
    load fixed along either dim, like a per-row mean or a per-column bias, is cheap both ways)."""
    if x_stride == 0 or r_stride == 0:
        return 0
    if r_stride == 1 or x_stride == 1:
        return -1 if r_stride == 1 else 1
    if x_stride.is_number and r_stride.is_number:
        return 1 if abs(x_stride) < abs(r_stride) else -1
    return 0


def write_columns(writer, stages, parallel):
    """The loop nest of a kernel `fits` accepted (lines inside the kernel's braces)."""
    first, rest = stages[0], stages[1:]
    outer = writer.outer
    x = writer.outer_vars[-1].name
    lines, depth = _block_loops(writer, parallel), len(outer) + 1
    pad = "  " * (depth + 1)
    lines.append(f"{pad}const int64_t {x}_end = std::min<int64_t>({x}b + {BLOCK}, {cindex(outer[-1])});")
    accs = _declare_accumulators(writer, first, lines, pad, x)
    inner_lines = []
    printer = ExprPrinter(inner_lines, depth + 2 + len(writer.inner), writer.memory, writer.locals,
                          writer.rows, set(writer.locals))
    writer.write_loop_body(first, accs, printer)
    for i, size in enumerate(writer.inner):
        lines.append("  " * (depth + 1 + i) + f"for (int64_t r{i} = 0; r{i} < {cindex(size)}; ++r{i}) {{")
    simd_pad = "  " * (depth + 1 + len(writer.inner))
    lines.append(f"{simd_pad}#pragma omp simd")
    lines.append(f"{simd_pad}for (int64_t {x} = {x}b; {x} < {x}_end; ++{x}) {{")
    lines += inner_lines
    lines.append(f"{simd_pad}}}")
    for i in reversed(range(len(writer.inner))):
        lines.append("  " * (depth + 1 + i) + "}")
    for node in first:
        if not node.is_reduction:
            del writer.locals[node.name]
    lines += _finish(writer, first, rest, accs, depth + 1, x)
    for level in reversed(range(len(outer))):  # the loops _block_loops opened
        lines.append("  " * (level + 2) + "}")
    return lines


def _block_loops(writer, parallel):
    """Loops over the output dims but the last, then over blocks of the last (`x<n>b`)."""
    outer, lines = writer.outer, []
    x = writer.outer_vars[-1].name
    if parallel:
        collapse = f" collapse({len(outer)})" if len(outer) > 1 else ""
        lines.append(f"    #pragma omp parallel for{collapse} num_threads({writer.threads}){writer.parallel_if}")
    for i, size in enumerate(outer[:-1]):
        lines.append("  " * (i + 2) + f"for (int64_t x{i} = 0; x{i} < {cindex(size)}; ++x{i}) {{")
    lines.append("  " * (len(outer) + 1) + f"for (int64_t {x}b = 0; {x}b < {cindex(outer[-1])}; {x}b += {BLOCK}) {{")
    return lines


def _declare_accumulators(writer, stage, lines, pad, x):
    accs = {}
    for node in stage:
        if node.is_reduction:
            name, ctype = f"acc_{node.name}", writer.accumulator_ctype(node)
            lines.append(f"{pad}{ctype} {name}[{BLOCK}];")
            lines.append(f"{pad}for (int64_t {x} = {x}b; {x} < {x}_end; ++{x}) "
                         f"{name}[{x} - {x}b] = {reduction_init(node.reduction_type, ctype)};")
            accs[node.name] = (f"{name}[{x} - {x}b]", ctype)
    return accs


def _finish(writer, first, rest, accs, depth, x):
    """Per output point of the block: the reductions' results, then the work that follows them."""
    pad = "  " * depth
    body = []
    printer = ExprPrinter(body, depth + 1, writer.memory, writer.locals)
    for node in first:
        if node.is_reduction:
            printer.mapping = writer.maps[node.name]
            writer.finish_value(node, writer.reduction_result(node, accs[node.name][0]), printer)
    for stage in rest:
        for node in stage:
            printer.mapping = writer.maps[node.name]
            writer.finish_value(node, printer.expr(node.body), printer)
    return [f"{pad}for (int64_t {x} = {x}b; {x} < {x}_end; ++{x}) {{"] + body + [f"{pad}}}"]
