"""The scalar ops of kiln's loop IR (`ir.Expr.op`): each op's arity and dtype rule, in one table.

Every codegen must print every op here (tests/compiler/test_ir_ops.py checks the C++ one), and
`verify` checks a scheduled program against the table: with option `debug` on, each compile does.
A rule names how the result's dtype relates to the operands':

- same:     every operand has the result's dtype
- float:    same, and that dtype is a floating one
- integer:  same, and that dtype is an integer or bool
- compare:  the operands share a dtype; the result is bool
- bool:     the result is bool (operands of any dtype)
- float_test: one floating operand; the result is bool
- where:    a bool condition, then two values of the result's dtype
- convert:  one operand of any dtype (cast, round_to)
- leaf:     no Expr operands (const, index); load and check_index have their own shapes
"""
import dataclasses

import torch

from kiln.compiler import ir


@dataclasses.dataclass(frozen=True)
class OpSpec:
    arity: int
    rule: str


def _ops(rule, arity, *names):
    return {name: OpSpec(arity, rule) for name in names}


OPS = {
    **_ops("leaf", 1, "const", "index"),
    **_ops("load", 3, "load"),
    **_ops("check_index", 4, "check_index"),
    **_ops("convert", 1, "cast", "round_to"),
    **_ops("same", 2, "add", "sub", "mul", "truediv", "maximum", "minimum", "floordiv", "truncdiv", "remainder",
           "fmod", "ipow"),
    **_ops("same", 1, "neg", "abs", "relu", "sign", "floor", "ceil", "trunc", "round", "reciprocal"),
    **_ops("float", 1, "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
           "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "sigmoid",
           "lgamma"),
    **_ops("float", 2, "atan2", "pow"),
    **_ops("integer", 2, "bitwise_and", "bitwise_or", "bitwise_xor"),
    **_ops("integer", 1, "bitwise_not"),
    **_ops("compare", 2, "eq", "ne", "lt", "le", "gt", "ge"),
    **_ops("bool", 2, "logical_and", "logical_or", "logical_xor"),
    **_ops("bool", 1, "logical_not"),
    **_ops("float_test", 1, "isnan", "isinf"),
    **_ops("where", 3, "where"),
}


class IRVerifyError(AssertionError):
    """The IR breaks the op table (a kiln bug): names the buffer, the op and what is wrong."""


def check_expr(e):
    """Why the single node `e` breaks the table, or None."""
    spec = OPS.get(e.op)
    if spec is None:
        return f"unknown op {e.op!r}"
    if len(e.args) != spec.arity:
        return f"{e.op} takes {spec.arity} operand(s), has {len(e.args)}"
    if not isinstance(e.dtype, torch.dtype):
        return f"{e.op} has no dtype ({e.dtype!r})"
    if spec.rule in ("leaf", "load", "check_index"):
        return _check_leaf(e, spec.rule)
    operands = list(e.args)
    if not all(isinstance(a, ir.Expr) for a in operands):
        return f"{e.op} has an operand that is not an Expr"
    dtypes = [a.dtype for a in operands]
    return _RULES[spec.rule](e.dtype, dtypes)


def _check_leaf(e, rule):
    if rule == "leaf" and isinstance(e.args[0], ir.Expr):
        return f"{e.op} holds an Expr, not a value"
    if rule == "load" and not isinstance(e.args[0], str):
        return "load of something that is not a buffer name"
    return None


def _same(dtype, dtypes):
    bad = [d for d in dtypes if d != dtype]
    return f"operand dtype {bad[0]} differs from the result's {dtype}" if bad else None


def _float(dtype, dtypes):
    return _same(dtype, dtypes) or (None if dtype.is_floating_point else f"needs a floating dtype, has {dtype}")


def _integer(dtype, dtypes):
    return _same(dtype, dtypes) or (f"needs an integer or bool dtype, has {dtype}" if dtype.is_floating_point else None)


def _compare(dtype, dtypes):
    if dtype != torch.bool:
        return f"a comparison gives bool, not {dtype}"
    return None if len(set(dtypes)) == 1 else f"compares different dtypes {dtypes}"


def _bool(dtype, dtypes):
    return None if dtype == torch.bool else f"gives bool, not {dtype}"


def _float_test(dtype, dtypes):
    return _bool(dtype, dtypes) or (None if dtypes[0].is_floating_point else f"tests a {dtypes[0]} value")


def _where(dtype, dtypes):
    if dtypes[0] != torch.bool:
        return f"where's condition is {dtypes[0]}, not bool"
    return _same(dtype, dtypes[1:])


_RULES = {"same": _same, "float": _float, "integer": _integer, "compare": _compare, "bool": _bool,
          "float_test": _float_test, "where": _where, "convert": lambda dtype, dtypes: None}


def verify(program):
    """Check every scalar expression of a scheduled program (schedule.Program) against OPS; raise
    IRVerifyError naming the first bad one."""
    from kiln.compiler.schedule import Kernel
    for step in program.steps:
        if not isinstance(step, Kernel):
            continue
        for node in step.nodes:
            for root in _roots(node):
                for e in root.walk():
                    why = check_expr(e)
                    if why:
                        raise IRVerifyError(f"{step.name}, buffer {node.name}: {why} in {e!r}")


def _roots(node):
    """The Exprs a loop node computes: its body, and a scatter's values and positions."""
    roots = [node.body]
    plan = node.sequential
    for name in ("value", "positions"):
        value = getattr(plan, name, None)
        roots += [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, ir.Expr)]
    return roots
