"""Triton source for scheduled kernels: one @triton.jit function per kernel.

A kernel runs over blocks of [XBLOCK, RBLOCK] points: each program takes XBLOCK outer points (the
flat outer index split into the kernel's loop variables x0, x1, ...) and walks the reduction extent
RBLOCK at a time (r0, r1, ...). Its stages (schedule.kernel_stages) run in order per block of outer
points:
- a pointwise kernel is one stage over [XBLOCK, 1];
- a reduction whose row fits one block (static, at most PERSISTENT_RBLOCK) is *persistent*: each
  stage is one pass over the whole row, and every value, reductions included, stays in registers
  for later stages (softmax, layer norm: one read of the input);
- a longer or symbolic row loops over it per stage; reductions accumulate [XBLOCK, RBLOCK]
  partials, reduced along the block at the end of the loop; a value a later stage reads again
  goes through memory (its storage is planned as a tensor: triton_backend.plan_storage).
Sizes the kernel needs (symbolic sizes included) are arguments, so one kernel serves every size.
"""
import dataclasses
import re

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.codegen.kernel_backend import BackendUnsupported
from kiln.compiler.codegen.cpp_memory import Checks, KernelIndexError
from kiln.compiler.codegen.triton_libm import interpreting
from kiln.compiler.codegen.triton_exprs import (BLOCK_SHAPES, REDUCTIONS, TL_TYPES, TritonPrinter, compute_dtype,
                                                reduction_identity, round_to_half,
                                                tindex, tl_type)
from kiln.compiler.loop_nodes import loop_var
from kiln.compiler.schedule import kernel_stages
from kiln.compiler.schedule_sequential import ScatterPlan

PERSISTENT_RBLOCK = 1024   # rows up to this long are reduced in one block, values kept in registers
LOOPED_RBLOCK = 512        # longer rows: this many elements of a row per step
MAX_BLOCK_ELEMENTS = 4096  # XBLOCK * RBLOCK of a reduction kernel
POINTWISE_XBLOCK = 1024
INT32_LIMIT = 2**31 - 1


# a scan's update of its accumulator `acc` (and position `acc_i`) with value `v` at step r0, as eager
# (cpp_sequential's rules): cummax/cummin take a NaN or a value at least as large (small)
_TAKES = "take = (r0 == 0) | (v != v) | ((acc == acc) & (v {} acc))"
SCAN_UPDATES = {
    "sum": ["acc = acc + v"],
    "prod": ["acc = acc * v"],
    "max": [_TAKES.format(">="), "acc = tl.where(take, v, acc)"],
    "min": [_TAKES.format("<="), "acc = tl.where(take, v, acc)"],
    "argmax": [_TAKES.format(">="), "acc = tl.where(take, v, acc)", "acc_i = tl.where(take, r0, acc_i)"],
    "argmin": [_TAKES.format("<="), "acc = tl.where(take, v, acc)", "acc_i = tl.where(take, r0, acc_i)"],
    # a NaN on either side propagates (tl.minimum's default leaves NaN to the implementation:
    # Triton 3.8's interpreter drops it, and logcumsumexp went on past a NaN)
    "logsumexp": ["lo = tl.minimum(v, acc, propagate_nan=tl.PropagateNan.ALL)",
                  "hi = tl.maximum(v, acc, propagate_nan=tl.PropagateNan.ALL)",
                  'finite = (lo == lo) & (lo != float("inf")) & (lo != float("-inf"))',
                  "acc = tl.where((lo != hi) | finite, libm.log1p(tl.exp(lo - hi)) + hi, v)"],
}


# welford_m2 over a looped row: each lane's running (mean `acc`, squared deviations `acc_m2`, count
# `acc_n`) takes in value `v` where `mask` holds (Welford's update); the lanes are combined at the end
WELFORD_STEP = ["{acc}_v = {masked}",
                "{acc}_n1 = {acc}_n + mask.to({t})",
                "{acc}_d = {acc}_v - {acc}",
                "{acc} = tl.where(mask, {acc} + {acc}_d / tl.maximum({acc}_n1, 1.0), {acc})",
                "{acc}_m2 = tl.where(mask, {acc}_m2 + {acc}_d * ({acc}_v - {acc}), {acc}_m2)",
                "{acc}_n = {acc}_n1"]


# arg reductions: the position a lane holds when it holds none, and the (value, position) combine
# (codegen/triton_exprs.PRELUDE) that keeps eager's choice whatever order the lanes meet in
ARG_NONE = {"argmax": 2**62, "argmin": 2**62, "window_argmax": -1}
ARG_COMBINES = {"argmax": "kiln_argmax_combine", "argmin": "kiln_argmin_combine",
                "window_argmax": "kiln_window_argmax_combine"}


def next_power_of_2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def persistent(kernel):
    """Whether the kernel's rows fit one block (see the module doc)."""
    return persistent_rows(kernel.rnumel)


def persistent_rows(rnumel):
    return rnumel.is_number and int(rnumel) <= PERSISTENT_RBLOCK


@dataclasses.dataclass
class Launch:
    """One @triton.jit function of a kernel and how it is launched: cdiv(numel, xblock) programs."""
    name: str
    numel: sympy.Expr
    rnumel: sympy.Expr
    xblock: int
    rblock: int
    num_warps: int
    kind: str = "pointwise"  # or "persistent", "looped": which blocks it may take (codegen/triton_autotune)


@dataclasses.dataclass
class TritonKernel:
    """One generated kernel: the buffers it takes (in argument order), the size symbols after them,
    and its launches, in order (a scatter: its initial copy, then the scatter)."""
    name: str
    kernels: list            # [the schedule.Kernel] (an entry of one kernel)
    args: list
    sizes: list
    launches: list
    source: str = ""
    uses_workspace: bool = False
    checks: list = dataclasses.field(default_factory=list)  # CheckSites: takes `kiln_err` (int64[3]) first
    device: object = None    # where its buffers are


def block_sizes(numel, rnumel, reduces):
    """(XBLOCK, RBLOCK, num_warps) from the sizes: static sizes pick blocks that fit them."""
    numel = int(numel) if numel.is_number else None
    if not reduces:
        xblock = min(POINTWISE_XBLOCK, next_power_of_2(numel)) if numel is not None else POINTWISE_XBLOCK
        return xblock, 1, max(1, min(8, xblock // 128))
    rblock = next_power_of_2(int(rnumel)) if persistent_rows(rnumel) else LOOPED_RBLOCK
    xblock = max(1, MAX_BLOCK_ELEMENTS // rblock) if rblock < 64 else max(1, min(8, MAX_BLOCK_ELEMENTS // rblock))
    if numel is not None:
        xblock = min(xblock, next_power_of_2(numel))
    warps = max(1, min(8, xblock * rblock // 256))
    return xblock, rblock, 1 << (warps.bit_length() - 1)


class TritonKernelWriter:
    def __init__(self, kernel, program, symbols):
        self.kernel, self.program = kernel, program
        self.storage = program.storage
        self.symbols = symbols
        self.checks = Checks()

    def index_site(self, what):
        return self.checks.site(KernelIndexError, f"an index is out of bounds for {what} with size {{bound}} "
                                                  f"(kiln kernel {self.kernel.name})")

    def printer(self, lines, indent, prefix, mask):
        return TritonPrinter(lines, indent, prefix, mask, self.locals, self.index_site)

    def write(self):
        k = self.kernel
        scan = k.nodes[0].sequential
        self.locals = {}
        self.reduces = scan is None and (k.rnumel != 1 or any(n.is_reduction for n in k.nodes))
        self.persistent = self.reduces and persistent(k)
        self.index_type = "tl.int64" if self.needs_int64() else "tl.int32"
        if isinstance(scan, ScatterPlan):
            return self.write_scatter(k.nodes[0])
        outer, inner = k.dims()
        if outer is None:
            raise BackendUnsupported(f"{k.name}'s nodes do not nest")
        self.maps = {n.name: k.var_map(n, outer, inner) for n in k.nodes}
        xblock, rblock, warps = block_sizes(k.numel, k.rnumel, self.reduces)
        body = self.block_start(outer)
        body.append(f"    rbase = tl.arange(0, RBLOCK)[None, :].to({self.index_type})")
        stages = [] if scan is not None else kernel_stages(k)
        if scan is not None:
            self.write_scan(k.nodes[0], body)
        for s, stage in enumerate(stages):
            if s and not self.persistent and self.reads_earlier_stage(stages[:s], stage):
                body.append("    tl.debug_barrier()  # values earlier stages stored, read back")
            if not self.reduces or (k.role(stage[0]) == "outer"):
                printer = self.printer(body, 1, f"t{s}_", "xmask")
                for node in stage:
                    printer.mapping = self.maps[node.name]
                    self.finish(node, printer.expr(node.body), printer, "xmask")
            else:
                self.write_reduction_stage(s, stage, inner, body)
        kind = "pointwise" if not self.reduces else "persistent" if self.persistent else "looped"
        return self.finish_kernel({k.name: body}, [Launch(k.name, k.numel, k.rnumel, xblock, rblock, warps, kind)])

    def block_start(self, sizes, names=None):
        """The first lines of a function: this program's XBLOCK points of `sizes` and their loop variables."""
        body = [f"    xindex = tl.program_id(0).to({self.index_type}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
                "    xmask = xindex < xnumel"]
        return body + self.split_index("xindex", "x", sizes, names)

    def finish_kernel(self, bodies, launches):
        """The TritonKernel of functions {name: body lines}, which take the same parameters."""
        k = self.kernel
        args = self.arguments()
        text = "\n".join(line for body in bodies.values() for line in body)
        used = [sym for sym in self.symbols if sym.name in _names(text)]
        sizes = [sym.name for sym in used]
        # a float computed from sizes (1.0 / x.size(1)) is a double in the wrapper, as in eager: the
        # annotation makes the compiled kernel take it so (a bare Python float is float32 to Triton),
        # and under the interpreter, which passes the Python float itself, tl.full types it
        floats = [f"    {sym.name} = tl.full([], {sym.name}, tl.float64)" for sym in used if not sym.is_integer]
        bodies = {name: floats + body for name, body in bodies.items()}
        # under the interpreter the loop bound is a constant: it holds a scalar argument as a 1-element
        # array, which NumPy >= 2.4 refuses to turn into the int `range` needs (compiled: an argument)
        rnumel = "rnumel: tl.constexpr" if interpreting() else "rnumel"
        params = (["kiln_err"] * bool(self.checks.sites) + args
                  + [sym.name if sym.is_integer else f"{sym.name}: tl.float64" for sym in used]
                  + ["xnumel", rnumel, "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"])
        source = "\n\n".join("\n".join(["@triton.jit", f"def {name}({', '.join(params)}):"] + body) + "\n"
                             for name, body in bodies.items())
        return TritonKernel(k.name, [k], args, sizes, launches, source, checks=self.checks.sites,
                            device=k.nodes[0].layout.device)

    def write_scatter(self, node):
        """A scatter: one function copies the initial value over the output; a second one walks the
        source points, XBLOCK points of the parallel dims per program and the serial dims in order
        inside it, so two points that hit one element (they differ in serial dims only) are one
        lane's, in eager's order. A position out of range writes nothing and is reported."""
        plan = node.sequential
        init = self.block_start(node.sizes)
        printer = self.printer(init, 1, "t", "xmask")
        self.finish(node, printer.expr(node.body), printer, "xmask")
        names = [f"q{d}" for d in range(len(plan.source_sizes))]
        par = [plan.source_sizes[d] for d in plan.parallel]
        ser = [plan.source_sizes[d] for d in plan.serial]
        body = self.block_start(par, [names[d] for d in plan.parallel])
        for identity in ([True, False] if not plan.include_self else [False]):  # one pass after the other
            body.append("    for sindex in tl.range(0, rnumel):  # the serial dims, in order")
            body += ["    " + line for line in self.split_index("sindex", "q", ser, [names[d] for d in plan.serial])]
            self.scatter_pass(node, body, identity)
        numel, serial = ir.sympy_product(par), ir.sympy_product(ser)
        xblock, _, warps = block_sizes(node.numel, 1, False)
        pblock, _, pwarps = block_sizes(numel, 1, False)
        return self.finish_kernel({f"{node.name}_init": init, self.kernel.name: body},
                                  [Launch(f"{node.name}_init", node.numel, sympy.Integer(1), xblock, 1, warps),
                                   Launch(self.kernel.name, numel, serial, pblock, 1, pwarps)])

    def scatter_pass(self, node, body, identity):
        """One pass over the source points: store the mode's identity at each target (include_self=False's
        first pass), or combine the value into it."""
        plan = node.sequential
        printer = self.printer(body, 2, f"s{int(identity)}_", "xmask")
        ok = "xmask"
        for k, (position, size) in enumerate(zip(plan.positions, plan.out_sizes)):
            if isinstance(position, ir.Expr):
                p = printer.temp(("position", k), f"{printer.expr(position)}.to(tl.int64)")
                bound = printer.index(size)
                bad = printer.temp(("bad", k), f"xmask & (({p} < 0) | ({p} >= {bound}))")
                code = self.index_site(f"a scatter into dimension {k}")
                printer.lines.append(f"        tl.store(kiln_err + {bad}.to(tl.int32) * 0, {bad}.to(tl.int64) * 0 + {code}, {bad})")
                printer.lines.append(f"        tl.store(kiln_err + 2 + {bad}.to(tl.int32) * 0, {bad}.to(tl.int64) * 0 + {bound}, {bad})")
                body.append(f"        p{k} = tl.where({bad}, 0, {p})")
                ok = printer.temp(("ok", k), f"{ok} & ~{bad}")
        dtype = TL_TYPES[node.layout.dtype]
        target = f"{node.name} + ({tindex(plan.target_index)} + tl.zeros([XBLOCK, 1], tl.int32))"
        if identity:
            value = f"tl.full([XBLOCK, 1], {reduction_identity(plan.mode, node.layout.dtype)}, {dtype})"
        else:
            # a half dtype combines in float32, rounded at each step as eager's half arithmetic is
            compute = tl_type(node.layout.dtype)
            value = f"tl.broadcast_to({printer.expr(plan.value)}, [XBLOCK, 1]).to({compute})"
            if plan.mode is not None:
                old = printer.temp(("old",), f"tl.load({target}, {ok}, other=0).to({compute})")
                value = self.combine(plan.mode, node.layout.dtype).format(acc=old, v=value)
            if node.layout.dtype in ir.HALF_DTYPES:
                value = round_to_half(value, node.layout.dtype)
        body.append(f"        tl.store({target}, ({value}).to({dtype}), {ok})")

    def needs_int64(self):
        """Whether an index may pass int32: symbolic sizes, or a buffer or loop that large."""
        extents = [self.kernel.numel * self.kernel.rnumel]
        for name in self.touched():
            layout = self.program.buffers[name].layout
            extents.append(layout.offset + sum(((s - 1) * st for s, st in zip(layout.sizes, layout.strides)),
                                               sympy.Integer(1)))
        return any(not e.is_number or int(e) >= INT32_LIMIT for e in map(sympy.sympify, extents))

    @staticmethod
    def split_index(flat, prefix, sizes, names=None):
        """Lines binding the loop variables of `sizes` (outermost first; named `names`, default
        prefix0, prefix1, ...) from the flat index."""
        lines, stride = [], sympy.Integer(1)
        names = names or [loop_var(prefix, k).name for k in range(len(sizes))]
        for k in reversed(range(len(sizes))):
            part = flat if stride == 1 else f"({flat} // {tindex(stride)})"
            code = part if k == 0 else f"{part} % {tindex(sympy.sympify(sizes[k]))}"
            lines.append(f"    {names[k]} = {code}")
            stride = stride * sizes[k]
        return lines

    def reads_earlier_stage(self, earlier, stage):
        written = {n.name for st in earlier for n in st if self.storage[n.name] not in ("local", "row")}
        return any(n.reads & written for n in stage)

    def write_reduction_stage(self, s, stage, inner, body):
        reductions = [n for n in stage if n.is_reduction]
        accs = {}
        pad = "    "
        for n in reductions:
            dtype = self.acc_dtype(n)
            accs[n.name] = (f"acc_{n.name}", dtype)
            if not self.persistent:
                init = reduction_identity(n.reduction_type, dtype)
                body.append(f"{pad}acc_{n.name} = tl.full([XBLOCK, RBLOCK], {init}, {TL_TYPES[dtype]})")
                if n.reduction_type in ir.ARG_REDUCTIONS:
                    body.append(f"{pad}acc_{n.name}_i = tl.full([XBLOCK, RBLOCK], {ARG_NONE[n.reduction_type]}, "
                                "tl.int64)")
                if n.reduction_type == "welford_m2":
                    body += [f"{pad}acc_{n.name}_{part} = tl.full([XBLOCK, RBLOCK], 0, {TL_TYPES[dtype]})"
                             for part in ("m2", "n")]
        loop = []
        if self.persistent:
            loop_indent = 1
            loop.append(f"{pad}rindex = rbase")
        else:
            loop_indent = 2
            body.append(f"{pad}for roffset in tl.range(0, rnumel, RBLOCK):")
            loop.append(f"{pad * 2}rindex = roffset + rbase")
        ipad = pad * loop_indent
        loop.append(f"{ipad}rmask = rindex < rnumel")
        loop += [pad * (loop_indent - 1) + line for line in self.split_index("rindex", "r", inner)]
        loop.append(f"{ipad}mask = xmask & rmask")
        printer = self.printer(loop, loop_indent, f"t{s}_", "mask")
        printer.narrow = not (self.persistent and int(self.kernel.rnumel) == 0)  # empty rows read nothing
        for node in stage:
            printer.mapping = self.maps[node.name]
            value = printer.expr(node.body)
            if not node.is_reduction:
                self.finish(node, value, printer, "mask")
                continue
            acc, dtype = accs[node.name]
            init = reduction_identity(node.reduction_type, dtype)
            masked = (f"tl.where(mask, tl.broadcast_to({value}, [XBLOCK, RBLOCK]).to({TL_TYPES[dtype]}), "
                      f"tl.full([], {init}, {TL_TYPES[dtype]}))")
            if node.reduction_type in ir.ARG_REDUCTIONS:
                loop += [ipad + line for line in self.arg_step(node.reduction_type, acc, masked)]
            elif node.reduction_type == "welford_m2" and not self.persistent:
                loop += [ipad + line.format(acc=acc, masked=masked, t=TL_TYPES[dtype]) for line in WELFORD_STEP]
            elif self.persistent:
                loop.append(f"{ipad}{acc} = {masked}")
            else:
                combine = self.combine(node.reduction_type, dtype)
                loop.append(f"{ipad}{acc} = {combine.format(acc=acc, v=masked)}")
        body += loop
        if not self.persistent:
            for node in stage:
                if not node.is_reduction:
                    self.locals.pop(node.name, None)  # out of scope after the loop
        outer_printer = self.printer(body, 1, f"u{s}_", "xmask")
        for node in reductions:
            acc, dtype = accs[node.name]
            if node.reduction_type in ir.ARG_REDUCTIONS:
                combine = ARG_COMBINES[node.reduction_type]
                body.append(f"{pad}_, {acc}_r = tl.reduce(({acc}, {acc}_i), 1, {combine})")
                reduced = f"{acc}_r"
            elif node.reduction_type == "welford_m2" and not self.persistent:
                body.append(f"{pad}_, {acc}_r, _ = tl.reduce(({acc}, {acc}_m2, {acc}_n), 1, kiln_welford_combine)")
                reduced = f"{acc}_r"
            else:
                reduced = self.final(node.reduction_type, dtype).format(acc=acc)
            result = f"{reduced}[:, None]"
            if node.layout.dtype in ir.HALF_DTYPES:
                result = round_to_half(f"{result}.to(tl.float32)", node.layout.dtype)
            else:
                result += f".to({tl_type(node.layout.dtype)})"
            var = outer_printer.temp(("reduced", node.name), result)
            outer_printer.mapping = self.maps[node.name]
            self.finish(node, var, outer_printer, "xmask")

    def arg_step(self, kind, acc, masked):
        """Lines folding this block's values (`masked`) and their positions in the row into the
        (value, position) accumulators of an arg reduction."""
        position = f"tl.where(mask, rindex.to(tl.int64) + tl.zeros([XBLOCK, RBLOCK], tl.int64), {ARG_NONE[kind]})"
        lines = [f"{acc}_v = {masked}"]
        if kind == "window_argmax":  # a position counts once its value passes -inf (or is NaN)
            lines.append(f'{acc}_p = tl.where(({acc}_v > float("-inf")) | ({acc}_v != {acc}_v), {position}, -1)')
        else:
            lines.append(f"{acc}_p = {position}")
        if self.persistent:
            return lines + [f"{acc}, {acc}_i = {acc}_v, {acc}_p"]
        return lines + [f"{acc}, {acc}_i = {ARG_COMBINES[kind]}({acc}, {acc}_i, {acc}_v, {acc}_p)"]

    def write_scan(self, node, body):
        """A scan: each program walks the scanned dim in order for its XBLOCK outer points, one
        accumulator each (eager's order of additions), storing the running value at every step."""
        plan = node.sequential
        if plan.scan_type not in SCAN_UPDATES:
            raise BackendUnsupported(f"a {plan.scan_type} scan in Triton")
        t = TL_TYPES[plan.acc_dtype]
        init = {"sum": "0", "prod": "1", "logsumexp": 'float("-inf")'}.get(plan.scan_type, "0")
        body.append(f"    acc = tl.full([XBLOCK, 1], {init}, {t})")
        body.append("    acc_i = tl.full([XBLOCK, 1], 0, tl.int64)")
        body.append("    for r0 in tl.range(0, rnumel):")
        printer = self.printer(body, 2, "t", "xmask")
        value = printer.expr(node.body)
        body.append(f"        v = {value}.to({t})")
        body += ["        " + line for line in SCAN_UPDATES[plan.scan_type]]
        result = "acc_i" if plan.scan_type in ("argmax", "argmin") else "acc"
        if node.layout.dtype in ir.HALF_DTYPES:
            result = round_to_half(f"{result}.to(tl.float32)", node.layout.dtype)
        self.finish(node, result, printer, "xmask")

    @staticmethod
    def acc_dtype(node):
        dtype = compute_dtype(node.body.dtype)
        return torch.bool if node.reduction_type in ("any", "all") else dtype

    @staticmethod
    def combine(kind, dtype):
        if kind in ("max", "min") and not dtype.is_floating_point:
            return "tl.maximum({acc}, {v})" if kind == "max" else "tl.minimum({acc}, {v})"
        return REDUCTIONS[kind][2]

    @staticmethod
    def final(kind, dtype):
        if kind in ("max", "min") and not dtype.is_floating_point:
            if dtype == torch.bool:
                return f"(tl.{kind}({{acc}}.to(tl.int8), 1) != 0)"
            return f"tl.{kind}({{acc}}, 1)"
        return REDUCTIONS[kind][3]

    def finish(self, node, value, printer, mask):
        """Keep `node`'s value for later readers in the kernel, and store it unless it stays in registers."""
        self.locals[node.name] = value
        storage = self.storage[node.name]
        if storage == "local" or (storage == "row" and self.persistent):
            return
        dtype = node.layout.dtype
        store = printer.index(node.store_index)
        printer.lines.append("    " * printer.indent + f"tl.store({node.name} + ({store} + tl.zeros({BLOCK_SHAPES[mask]}, tl.int32)), "
                             f"tl.broadcast_to({value}, {BLOCK_SHAPES[mask]}).to({TL_TYPES[dtype]}), {mask})")

    def touched(self):
        names = set()
        for n in self.kernel.nodes:
            names |= n.reads
            names.add(n.name)
        return [name for name in sorted(names, key=lambda s: (len(s), s))
                if self.storage.get(name) not in ("local",) and not (self.storage.get(name) == "row" and self.persistent)]

    def arguments(self):
        for name in self.touched():
            device = self.program.buffers[name].layout.device
            if device.type not in ("cuda", "cpu"):
                raise AssertionError(f"{self.kernel.name} would touch {name} on device {device}")
        return self.touched()


def _names(text):
    return set(re.findall(r"\b[a-z]+\d+\b", text))
