"""Trace the IR kinds that run in order along some dims (Scan, Scatter) into schedule LoopNodes.

Such a node is a kernel of its own: nothing fuses into or after it (its reads of a lazy producer
are already inlined by the lowering). The LoopNode's sizes/body/store_index describe its
parallel part (a scan's outer points; a scatter's initial copy); `sequential` holds the rest,
which codegen/cpp_sequential prints. Every dim keeps its own loop variable (no merging): these
loops are few and the dims carry the meaning.
"""
import dataclasses
from typing import Optional

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.loop_nodes import LoopNode, loop_var, substitute


@dataclasses.dataclass
class ScanPlan:
    """A scan along loop var r0 inside parallel loops x0..: the LoopNode's body is over (x*, r0)."""
    scan_type: str
    acc_dtype: torch.dtype
    along_last: bool  # the scan runs along the last dim (else the last dim is the innermost outer loop)


@dataclasses.dataclass
class ScatterPlan:
    """The scatter loop over source points (vars q0..), after the LoopNode's initial copy."""
    source_sizes: list
    parallel: list            # source dims run in parallel (outermost)
    serial: list              # source dims run in order, inside them
    value: ir.Expr            # over q*
    positions: tuple          # per out dim: sympy over q*, or an int64 Expr (checked at run time)
    out_sizes: tuple
    target_index: sympy.Expr  # the flat store index, over position symbols p0..
    mode: Optional[str]
    include_self: bool


def position_symbol(k):
    return sympy.Symbol(f"p{k}", integer=True)


def trace_sequential(buf):
    data = buf.data
    outer = [loop_var("x", k) for k in range(len(data.ranges))]
    if isinstance(data, ir.Scan):
        index = list(outer)
        index[data.dim] = loop_var("r", 0)
        body = data.inner_fn(tuple(index))
        sizes = [s for d, s in enumerate(data.ranges) if d != data.dim]
        # the outer vars skip the scan dim: rename x(k) after it to x(k-1)
        rename = {outer[k]: loop_var("x", k - 1) for k in range(data.dim + 1, len(outer))}
        body = substitute(body, rename)
        store = sympy.expand(buf.layout.index(index).xreplace(rename))
        return LoopNode(buf.name, buf.layout, sizes, [data.ranges[data.dim]], None, body, store,
                        {e.args[0] for e in body.loads()}, ScanPlan(data.scan_type, data.acc_dtype, data.dim == len(data.ranges) - 1))
    init = data.init_fn(tuple(outer))
    source = tuple(loop_var("q", k) for k in range(len(data.source_ranges)))
    value = data.value_fn(source)
    positions = tuple(data.target_fn(source))
    target = buf.layout.index([position_symbol(k) if isinstance(p, ir.Expr) else p for k, p in enumerate(positions)])
    exprs = [init, value] + [p for p in positions if isinstance(p, ir.Expr)]
    reads = {e.args[0] for x in exprs for e in x.loads()}
    serial = [d for d in range(len(source)) if d in data.serial_dims]
    plan = ScatterPlan(list(data.source_ranges), [d for d in range(len(source)) if d not in serial], serial,
                       value, positions, tuple(data.ranges), sympy.expand(target), data.mode, data.include_self)
    return LoopNode(buf.name, buf.layout, list(data.ranges), [], None, init, buf.layout.index(outer), reads, plan)
