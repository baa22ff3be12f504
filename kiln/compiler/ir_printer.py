"""The loop IR as text, in full: what `trace.enabled` writes and the compile report shows.

`print_ir` shows each buffer of a scheduled program: its layout, where it came from, its loops and
its scalar body, a subexpression used more than once named once (`t3 = ...`) and nothing cut short.
`print_schedule` shows the kernels: which buffers each fuses, their loops, and the extern calls
between them.
"""
import collections

import sympy
import torch

from kiln.compiler import ir
from kiln.compiler.provenance import user_line
from kiln.compiler.schedule import Kernel

_INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">=", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
          "logical_and": "and", "logical_or": "or"}


def _dtype(d):
    return str(d).replace("torch.", "")


class ExprText:
    """Prints Expr DAGs into `lines`. Equal subexpressions (equal by structure, as codegen shares
    them, not only the same object) used more than once become one named temporary, defined once."""

    def __init__(self, lines, indent="    "):
        self.lines, self.indent = lines, indent
        self.names = {}   # structural key -> temporary name
        self.keys = {}    # structure -> key (hash-consing: no exponential strings for shared DAGs)

    def __call__(self, root):
        memo = {}
        self._key(root, memo)
        uses = collections.Counter()
        for key, children in {k: c for k, c in memo.values()}.items():
            uses.update(children)
        return self._text(root, {id_: k for id_, (k, _) in memo.items()}, uses)

    def _key(self, e, memo):
        found = memo.get(id(e))
        if found is None:
            children = tuple(self._key(c, memo) for c in e.children())
            structure = (e.op, e.dtype, children, _leaf_args(e))
            found = memo[id(e)] = (self.keys.setdefault(structure, len(self.keys)), children)
        return found[0]

    def _text(self, e, key_of, uses):
        key = key_of[id(e)]
        if key in self.names:
            return self.names[key]
        text = self._render(e, key_of, uses)
        if uses[key] > 1 and e.op not in ("const", "index"):
            name = f"t{len(self.names)}"
            self.lines.append(f"{self.indent}{name}: {_dtype(e.dtype)} = {text}")
            self.names[key] = name
            return name
        return text

    def _render(self, e, key_of, uses):
        op, args = e.op, e.args
        sub = lambda a: self._text(a, key_of, uses)  # noqa: E731
        if op == "const":
            return repr(args[0])
        if op == "index":
            return f"index({args[0]})"
        if op == "load":
            name, index, bindings = args
            bound = "".join(f", {s}={sub(v)}" for s, v in bindings)
            return f"{name}[{index}{bound}]"
        if op == "check_index":
            return f"check_index({sub(args[0])}, < {args[1]})"
        inner = [sub(a) if isinstance(a, ir.Expr) else repr(a) for a in args]
        if op in ("cast", "round_to"):
            return f"{op}<{_dtype(e.dtype)}>({inner[0]})"
        if op in _INFIX and len(inner) == 2:
            return f"({inner[0]} {_INFIX[op]} {inner[1]})"
        return f"{op}({', '.join(inner)})"


def _leaf_args(e):
    """What besides its operands tells one Expr from another (a load's buffer and index, a constant)."""
    if e.op == "load":
        return (e.args[0], str(e.args[1]), tuple(str(s) for s, _ in e.args[2]))
    return tuple(repr(a) for a in e.args if not isinstance(a, ir.Expr))


def _loops(node):
    outer = " ".join(f"x{k}<{s}" for k, s in enumerate(node.sizes)) or "(one point)"
    if node.reduction_sizes and node.sequential is None:
        inner = " ".join(f"r{k}<{s}" for k, s in enumerate(node.reduction_sizes))
        return f"for {outer}: {node.reduction_type} over {inner}"
    if node.sequential is not None:
        return f"for {outer}: {type(node.sequential).__name__.replace('Plan', '').lower()} (in order)"
    return f"for {outer}"


def print_node(node, origins=(), lines=None):
    """One loop node (a computed buffer) as lines."""
    lines = [] if lines is None else lines
    layout = node.layout
    lines.append(f"{node.name}: {_dtype(layout.dtype)}{list(layout.sizes)} strides={list(layout.strides)}")
    for n in origins:
        line = user_line(n)
        lines.append(f"  # from {n.target}" + (f" at {line}" if line else ""))
    lines.append(f"  {_loops(node)}")
    value = ExprText(lines)(node.body)
    kind = f"{node.reduction_type}-reduce " if node.reduction_type and node.sequential is None else ""
    lines.append(f"    {node.name}[{node.store_index}] = {kind}{value}")
    return lines


def print_ir(program, origins=None):
    """Every buffer of `program` (schedule.Program): inputs, computed buffers and extern results."""
    origins = origins or {}
    lines = []
    inputs = [b for b in program.buffers.values() if isinstance(b, (ir.InputBuffer, ir.ConstantBuffer))]
    for buf in sorted(inputs, key=lambda b: (isinstance(b, ir.ConstantBuffer), getattr(b, "position", 0), b.name)):
        kind = f"input {buf.position}" if isinstance(buf, ir.InputBuffer) else "constant"
        lines.append(f"{buf.name}: {_dtype(buf.layout.dtype)}{list(buf.layout.sizes)} "
                     f"strides={list(buf.layout.strides)} ({kind})")
    for step in program.steps:
        if isinstance(step, Kernel):
            for node in step.nodes:
                lines.append("")
                print_node(node, origins.get(node.name, ()), lines)
        else:
            lines.append("")
            lines.append(_extern_text(step))
    return "\n".join(lines) + "\n"


def _extern_text(call):
    def arg(a):
        if isinstance(a, ir.BufferArg):
            return a.name if a.layout is None else f"as_strided({a.name}, {list(a.layout.sizes)}, " \
                                                   f"{list(a.layout.strides)}, {a.layout.offset})"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(map(arg, a)) + "]"
        return repr(a) if not isinstance(a, (sympy.Basic, torch.dtype)) else str(a)
    args = [arg(a) for a in call.args] + [f"{k}={arg(v)}" for k, v in call.kwargs.items()]
    return f"{call.outputs} = {call.target}({', '.join(args)})  # extern {call.name}, runs through aten"


def print_schedule(program):
    """The kernels in order: their names, loops, the buffers each computes (and how), and the externs."""
    lines = []
    for step in program.steps:
        if isinstance(step, Kernel):
            lines.append(f"{step.name}: {step.numel} x {step.rnumel}")
            lines += [f"  // {line}" for line in step.provenance]
            for node in step.nodes:
                role = step.role(node)
                storage = program.storage.get(node.name)
                lines.append(f"  {node.name}: {role}, {_loops(node)}, stored: {storage}")
        else:
            lines.append(f"extern {step.name}: {step.target} -> {step.outputs}")
    return "\n".join(lines) + "\n"
