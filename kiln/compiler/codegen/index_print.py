"""Sympy index expressions (sizes, strides, loop variables) as kernel source, in the spelling of
each kernel language (C++: cpp_exprs.cindex; Triton: triton_exprs.tindex), and what the expression
printers of both share (`LoopExprPrinter`).

Floor division and remainder are the language's own operators (C's truncating `/` and `%`) only
where sympy proves the dividend non-negative and the divisor positive, which loop variables and
sizes make the common case; elsewhere (a pad to a multiple, `(-n) % 127`) they call the kernel's
floor-semantics helpers, as Python and the ShapeEnv mean them."""
import dataclasses

import sympy


@dataclasses.dataclass(frozen=True)
class IndexSpelling:
    divide: str             # the integer division operator ("/" in C++, "//" in Triton)
    minimum: str            # functions of two indices
    maximum: str
    power: str | None       # PowByNatural as a call format ({0}, {1}); None: not spelled
    big_suffix: str         # after an integer literal of 2**31 or more
    unsupported: type       # the exception an expression it cannot spell raises
    floordiv: str           # Python's // and % as call formats ({0}, {1}), for operands of any sign
    mod: str


def print_index(e, spelling):
    """`e` (a sympy integer expression) as source text."""
    def go(e):
        if e.is_Integer:
            return f"{int(e)}{spelling.big_suffix}" if abs(int(e)) >= 2**31 else str(int(e))
        if e.is_Symbol:
            return e.name
        if e.is_Add:
            return "(" + " + ".join(go(a) for a in e.args) + ")"
        if e.is_Mul:
            return "(" + " * ".join(go(a) for a in e.args) + ")"
        if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([go(e.base)] * int(e.exp)) + ")"
        kind = type(e).__name__
        args = [go(a) for a in e.args]
        native = _never_negative(e.args)
        if kind in ("Mod", "PythonMod"):
            return f"({args[0]} % {args[1]})" if native else spelling.mod.format(*args)
        if kind in ("FloorDiv", "CleanDiv"):
            return f"({args[0]} {spelling.divide} {args[1]})" if native else spelling.floordiv.format(*args)
        if kind == "ModularIndexing":  # (a / b) % c
            if native:
                return f"(({args[0]} {spelling.divide} {args[1]}) % {args[2]})"
            return spelling.mod.format(spelling.floordiv.format(args[0], args[1]), args[2])
        if kind == "PowByNatural" and spelling.power is not None:
            return spelling.power.format(*args)
        if kind in ("Min", "Max"):
            fn = spelling.minimum if kind == "Min" else spelling.maximum
            out = args[0]
            for a in args[1:]:
                out = f"{fn}({out}, {a})"
            return out
        raise spelling.unsupported(f"index expression {e}")
    return go(e)


def _never_negative(args):
    """The dividend is provably >= 0 and every divisor > 0: C's truncating / and % then floor."""
    return bool(args[0].is_nonnegative) and all(bool(a.is_positive) for a in args[1:])


class LoopExprPrinter:
    """The part of an Expr printer both kernel languages share: `mapping` (a node's loop variables
    -> the kernel's), and one printed value per (Expr node, mapping); subclasses define `_print`."""
    mapping: dict
    memo: dict

    def mapped(self, e, extra=None):
        """Index `e` over the kernel's loop variables (`extra`: more symbols to replace)."""
        mapping = dict(self.mapping)
        mapping.update(extra or {})
        return sympy.expand(e.xreplace(mapping))

    def expr(self, e):
        key = (id(e), tuple(sorted(self.mapping.items(), key=str)))
        if key not in self.memo:
            self.memo[key] = self._print(e)
        return self.memo[key]
