"""C++/OpenMP code for a scheduled program: one translation unit, no torch headers.

Each run of kernels with no extern call between them becomes one `extern "C"` entry taking raw
pointers (and, with dynamic shapes, the size symbols its loops use as int64_t); the wrapper calls
it once. Inside, a kernel is an OpenMP-parallel loop over its outer points (when the work is big
enough: decided when it runs if its sizes are symbolic) with `#pragma omp simd` innermost loops; reductions
accumulate in registers (`omp simd reduction` where reassociation is allowed); values that
never leave the kernel stay in registers. No -ffast-math: NaN/inf follow IEEE as eager does,
and the helpers of cpp_prelude give max/min/floor-division/remainder eager's exact semantics;
cpp_exprs prints expressions, cpp_columns and cpp_sequential write the special loop nests.
"""
import dataclasses
import re

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.codegen import cpp_columns
from kiln.compiler.codegen.cpp_exprs import (CTYPES, REDUCTIONS, ExprPrinter, cindex, compute_ctype, reduction_init,
                                             simd_reduction_op)
from kiln.compiler.codegen.cpp_prelude import LINK_FLAGS, PRELUDE  # noqa: F401 (LINK_FLAGS: what its source links)
from kiln.compiler.codegen.cpp_memory import ERROR_FLAG, Checks, Memory, extent
from kiln.compiler.codegen.cpp_sequential import write_sequential
from kiln.config import bounds_checks_default
from kiln.compiler.loop_nodes import loop_var
from kiln.compiler.schedule import Kernel, kernel_stages

# below this many float elements a sum accumulates in float (omp simd keeps 8-16 partial sums)
DOUBLE_ACCUMULATE_FROM = 4096
PARALLEL_CHUNK = 4096


@dataclasses.dataclass
class Entry:
    """One native function: the kernels it runs and the buffers it takes, in argument order."""
    name: str
    kernels: list
    args: list          # buffer names passed as pointers
    uses_workspace: bool
    sizes: list = dataclasses.field(default_factory=list)  # size symbols passed as int64_t, after the pointers
    checks: list = dataclasses.field(default_factory=list)  # CheckSites: takes `int64_t* kiln_err` last
    packed: bool = False  # takes those as one array of 64-bit words (over PACK_ABOVE arguments)


# An entry with more arguments than this takes them as one array of 64-bit words: ctypes calls
# functions of at most 1024 arguments (a sum of 1100 tensors, or the backward of an unbind of 1031
# rows, fuses that many buffers into one entry), and a call this wide costs its conversions anyway.
PACK_ABOVE = 256


class KernelWriter:
    def __init__(self, kernel: Kernel, program, memory, options, pointer_of, checks):
        self.kernel, self.program, self.options = kernel, program, options
        self.ws_offsets, self.pointer_of = memory.workspace_offsets, pointer_of
        # a buffer written into an input's memory, and that input: two names for one memory, so
        # neither pointer is __restrict__ (the compiler must not move a load past the store)
        self.shared_memory = {n for out, inp in memory.inplace.items() for n in (out, inp)
                              if any(node.name == out for node in kernel.nodes)}
        self.checks = checks  # the translation unit's check sites (codegen/cpp_memory)
        self.threads = options.get("cpp.threads", -1)
        if self.threads is None or self.threads < 1:
            self.threads = torch.get_num_threads()
        self.min_work = options.get("cpp.min_parallel_work", 32768)

    def write(self):
        k = self.kernel
        if k.nodes[0].sequential is not None:  # a Scan or Scatter: its own loops
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
        outer_printer = ExprPrinter(body, body_indent, self.memory, self.locals)
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
        """Declare the pointers of the buffers this kernel reaches (and, with bounds checks, their
        extents); sets `self.memory`, through which every access is printed."""
        names = set()
        for n in self.kernel.nodes:
            names |= n.reads
            if self.program.storage[n.name] != "local":
                names.add(n.name)
        pointers, extents, out = {}, {}, []
        for name in sorted(names, key=lambda s: (len(s), s)):
            if self.program.storage.get(name) in ("local", "row"):
                continue
            buf = self.program.buffers[name]
            if buf.layout.device.type != "cpu":  # the device seam keeps such kernels away: a kiln bug
                raise AssertionError(f"{self.kernel.name} would touch {name} on device {buf.layout.device}")
            ctype = CTYPES[buf.layout.dtype]
            written = any(n.name == name for n in self.kernel.nodes)
            const = "" if written else "const "
            source = (f"(ws + {cindex(sympy.sympify(self.ws_offsets[name]))})"
                      if self.program.storage[name] == "workspace"
                      else self.pointer_of(name))
            restrict = "" if name in self.shared_memory else " __restrict__"
            out.append(f"    {const}{ctype}*{restrict} {name} = ({const}{ctype}*){source};")
            pointers[name] = name
            if self.checks.bounds_checks:
                extents[name] = f"extent_{name}"
                out.append(f"    const int64_t extent_{name} = {extent(buf.layout)};")
        self.memory = Memory(self.checks, self.kernel.name, pointers, extents)
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
            printer.lines.append("  " * printer.indent + self.memory.store(node.name, store, out))

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
        printer = ExprPrinter(loop_lines, inner_indent, self.memory, self.locals, self.rows, set(self.locals))
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


def _unpack(param, k):
    """The declaration of parameter `param` ("void* p_x", "const double s0") read from word k of
    kiln_packed_args (a double's bits copied, not converted)."""
    ctype, name = param.rsplit(" ", 1)
    if "double" in ctype:
        return f"  double {name}; std::memcpy(&{name}, &kiln_packed_args[{k}], sizeof(double));"
    return f"  {ctype} {name} = ({ctype.replace('const ', '')})kiln_packed_args[{k}];"


def generate(program, memory, options, symbols=(), kernels=None):
    """The C++ source for `program`'s `kernels` (default: all) and its entries (one per run of them
    with no other step between), its buffers placed as `memory` (a memory_plan.MemoryPlan) says.
    `symbols`: the size symbols (and float symbols: doubles); an entry takes those its kernels use."""
    entries, current = [], None
    mine = None if kernels is None else {id(k) for k in kernels}
    for step in program.steps:
        if isinstance(step, Kernel) and (mine is None or id(step) in mine):
            if current is None:
                current = Entry(f"kiln_entry{len(entries)}", [], [], False)
                entries.append(current)
            current.kernels.append(step)
        else:
            current = None
    parts = [PRELUDE]
    checks = Checks(bounds_checks=options.get("debug_bounds_checks", bounds_checks_default()))
    for entry in entries:
        args = []

        def pointer_of(name, args=args):
            if name not in args:
                args.append(name)
            return f"p_{name}"
        body = []
        first_site = len(checks.sites)
        for kernel in entry.kernels:
            writer = KernelWriter(kernel, program, memory, options, pointer_of, checks)
            lines = writer.write()
            body += [f"  // {line}" for line in kernel.provenance]  # its aten ops and user lines
            body += writer.memory.finish(lines)  # the index checks wired into its loops
        entry.checks = checks.sites[first_site:]
        entry.args = args
        entry.uses_workspace = any(program.storage[n.name] == "workspace" or
                                   any(program.storage.get(r) == "workspace" for r in n.reads)
                                   for k in entry.kernels for n in k.nodes)
        used = set(re.findall(r"\b[a-z]+\d+\b", "\n".join(body)))
        entry.sizes = [str(sym) for sym in symbols if str(sym) in used]
        ctypes_of = {str(sym): "int64_t" if sym.is_integer else "double" for sym in symbols}
        params = ([f"void* p_{a}" for a in args] + (["char* ws"] if entry.uses_workspace else [])
                  + [f"const {ctypes_of[name]} {name}" for name in entry.sizes])
        params += [f"int64_t* {ERROR_FLAG}"] if entry.checks else []
        entry.packed = len(params) > PACK_ABOVE
        if entry.packed:  # each parameter is read out of the array, in order
            unpack = [_unpack(param, k) for k, param in enumerate(params)]
            params = ["const int64_t* kiln_packed_args"]
            body = unpack + body
        parts.append(f'extern "C" void {entry.name}({", ".join(params)}) {{')
        parts += body
        parts.append("}\n")
    return "\n".join(parts), entries
