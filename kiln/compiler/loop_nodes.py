"""Loop nodes: one IR buffer traced into loops over symbolic variables (x* outer, r* reduction),
the unit that schedule fuses into kernels and codegen prints. `substitute` renames the loop
variables inside a traced body.
"""
import dataclasses
from typing import Optional

import sympy

from kiln.compiler import ir


def loop_var(prefix, k):
    return sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True)


@dataclasses.dataclass
class LoopNode:
    name: str
    layout: ir.Layout
    sizes: list                  # outer loop sizes (merged)
    reduction_sizes: list        # reduction loop sizes (merged); [] for pointwise
    reduction_type: Optional[str]
    body: ir.Expr                # over vars x0.. (and r0..)
    store_index: sympy.Expr      # over vars x0..
    reads: set
    # a Scan or Scatter (see schedule_sequential): runs alone in its kernel, printed by codegen/cpp_sequential
    sequential: object = None

    @property
    def numel(self):
        return ir.sympy_product(self.sizes)

    @property
    def rnumel(self):
        return ir.sympy_product(self.reduction_sizes)

    @property
    def is_reduction(self):
        return self.reduction_type is not None

    def vars(self):
        return [loop_var("x", k) for k in range(len(self.sizes))]

    def rvars(self):
        return [loop_var("r", k) for k in range(len(self.reduction_sizes))]


def substitute(expr, mapping):
    """`expr` with sympy symbols in its indices replaced per `mapping` (the DAG is preserved)."""
    memo = {}

    def go(e):
        if id(e) in memo:
            return memo[id(e)]
        if e.op == "load":
            name, index, bindings = e.args
            new = ir.Expr("load", (name, sympy.expand(index.xreplace(mapping)),
                                   tuple((s, go(v)) for s, v in bindings)), e.dtype)
        elif e.op == "index":
            new = ir.Expr("index", (sympy.expand(e.args[0].xreplace(mapping)),), e.dtype)
        else:
            new = ir.Expr(e.op, tuple(go(a) if isinstance(a, ir.Expr) else a for a in e.args), e.dtype)
        memo[id(e)] = new
        return new
    return go(expr)
