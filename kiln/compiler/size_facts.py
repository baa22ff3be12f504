"""What the trace's guards proved about symbolic sizes, for lowerings that must decide something
about a size (is this dim 1? is this slice start past the end?) without assuming it.

A graph with symbolic sizes is only ever run on inputs its guards admit, so a fact the guards
(and the symbols' ranges) imply holds on every call; anything else may or may not hold, and a
lowering must either handle both cases (a clamp in the index) or decline (`Fallback`). The
questions go to the ShapeEnv the graph was traced in and never add a guard. A static graph has
no ShapeEnv: its sizes are numbers and the answer is arithmetic.
"""
import sympy
import torch


class SizeFacts:
    def __init__(self, shape_env=None):
        self.shape_env = shape_env

    @classmethod
    def of_graph(cls, gm):
        """The facts of the ShapeEnv that `gm`'s placeholder values were traced in."""
        for node in gm.graph.find_nodes(op="placeholder"):
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt):
                return cls(val.node.shape_env)
            fake_mode = getattr(val, "fake_mode", None)
            if getattr(fake_mode, "shape_env", None) is not None and _has_symbols(val):
                return cls(fake_mode.shape_env)
        return cls()

    def known(self, cond):
        """Whether `cond` (a sympy relation over sizes) holds on every call the guards admit."""
        cond = sympy.sympify(cond)
        if cond is sympy.true or cond is sympy.false:
            return bool(cond)
        if self.shape_env is None or not cond.free_symbols:
            return False
        try:
            return bool(self.shape_env._maybe_evaluate_static(cond) is sympy.true)
        except Exception:  # noqa: BLE001 - a question the ShapeEnv cannot answer is not a known fact
            return False

    def equal(self, a, b):
        return a == b or self.known(sympy.Eq(a, b))

    def clamp(self, e, low, high):
        """e clamped into [low, high], as sympy: each bound the guards prove e keeps (or crosses)
        is left out (or taken), the others stay in as Max/Min."""
        if self.known(sympy.Le(e, low)):
            return sympy.sympify(low)
        if self.known(sympy.Ge(e, high)):
            return sympy.sympify(high)
        e = e if self.known(sympy.Ge(e, low)) else sympy.Max(e, low)
        return e if self.known(sympy.Le(e, high)) else sympy.Min(e, high)


def _has_symbols(t):
    return isinstance(t, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))
