"""Which user line made each shape guard, and whether a marked-dynamic dim was forced static.

The ShapeEnv records guards while fake tensors run, but it only sees kiln's own Python stack: the
user's code is interpreted, not executed. So the interpreter calls `after_step` after every
instruction; new guards and replacements since the last step are attributed to the innermost user
line being interpreted. Capture notes the glue's and the backend's guards the same way (a backend may
specialize too). At the end `check_marked` raises for a dim the user marked with
kiln.mark_dynamic that the program pinned to one size (or, with bounds, to a narrower range).
"""
import linecache

import sympy

from kiln.capture.user_files import is_user_file
from kiln.debug import report
from kiln.debug.logs import log
from kiln.exc import ConstraintViolation


class ShapeWatch:
    def __init__(self, shape_env):
        self.env = shape_env
        self.dims = {}      # sympy Symbol -> (Source, dim, reason, mark_dynamic bounds or None)
        self.forced = {}    # Symbol -> (what it became, guard text, user line) the first time it changed
        self.guard_lines = []  # (guard expr, user line) in the order the ShapeEnv added them
        self._seen = (0, 0)  # (number of guards, number of replacements) already attributed

    def add_input(self, fake, source, dims, bounds):
        """Watch the symbols of `fake` (the dims in `dims`: {dim: reason}); bounds: {dim: (min, max)}."""
        for d, why in dims.items():
            expr = fake.shape[d].node.expr
            if isinstance(expr, sympy.Symbol):
                self.dims[expr] = (source, d, why, bounds.get(d))

    def after_step(self, frame, inst):
        if self._changed():
            self.note(user_line(frame, inst))

    def _changed(self):
        return (len(self.env.guards), len(self.env.replacements)) != self._seen

    def note(self, where):
        """Attribute the guards and specializations made since the last note to `where`."""
        env = self.env
        if env is None:  # no ShapeEnv yet: no size is symbolic, no guard to attribute
            return
        new = [g.expr for g in env.guards[self._seen[0]:]]
        for expr in new:
            log("dynamic", "guard %s added at %s", self.describe(expr), where)
            self.guard_lines.append((expr, where))
        self._seen = (len(env.guards), len(env.replacements))
        self._note_forced(where, new)

    def _note_forced(self, where, new_guards):
        for sym, (source, d, why, _) in self.dims.items():
            now = self.env.replace(sym)
            if sym in self.forced or now == sym:
                continue
            guard = next((g for g in new_guards if sym in g.free_symbols), None)
            self.forced[sym] = (now, self.describe(guard) if guard is not None else "?", where)
            # a constant is a specialization; another expression only ties this size to other sizes
            what = f"specialized to size {now}" if now.is_number else f"found equal to {self.describe(now)}"
            log("dynamic", "%r.size()[%d] (dynamic: %s) %s by guard %s at %s", source, d, why, what,
                self.forced[sym][1], where)
            report.size_pinned(f"{source!r}.size()[{d}] {what} by guard {self.forced[sym][1]}", where)

    def check_marked(self):
        """Raise ConstraintViolation for a mark_dynamic dim the program forced static or narrowed."""
        for sym, (source, d, why, bounds) in self.dims.items():
            if bounds is None:
                continue
            now, guard, where = self.forced.get(sym, (sym, None, None))
            if now.is_number:
                raise ConstraintViolation(
                    f"{source!r}.size()[{d}] was marked dynamic with kiln.mark_dynamic, but the program "
                    f"specialized it to the constant {now} (guard {guard}) at {where}; remove the mark or make "
                    f"that code independent of this size", source=source, dim=d, where=where)
            self._check_range(sym, source, d, bounds)

    def _check_range(self, sym, source, d, bounds):
        low, high = bounds
        if low is None and high is None:
            return
        vr = self.env.var_to_range[sym]
        want_low = 2 if low is None or low < 2 else low
        if int(vr.lower) > want_low or (high is not None and vr.upper < high):
            raise ConstraintViolation(
                f"{source!r}.size()[{d}] was marked dynamic in [{low}, {high}] with kiln.mark_dynamic, but the "
                f"program only works for sizes in [{vr.lower}, {vr.upper}]; narrowing guards:\n" +
                "\n".join(f"  {t}" for t in self.guards_on(sym)), source=source, dim=d)

    def guards_on(self, sym):
        return [f"{self.describe(e)} at {where}" for e, where in self.guard_lines if sym in e.free_symbols]

    def describe(self, expr):
        """`expr` with symbols written as the input sizes they stand for (L['x'].size()[0])."""
        names = {s: sympy.Symbol(f"{src!r}.size()[{d}]") for s, (src, d, _, _) in self.dims.items()}
        return str(expr.xreplace(names)) if hasattr(expr, "xreplace") else str(expr)


def user_line(frame, inst):
    """`file:line: code` of the innermost user-code line in the interpreted call chain."""
    f = frame
    while f.parent is not None and not is_user_file(f.code.co_filename):
        f = f.parent
    current = inst if f is frame else f.current
    line = current.positions.lineno if current is not None and current.positions else f.code.co_firstlineno
    text = linecache.getline(f.code.co_filename, line).strip()
    return f"{f.code.co_filename}:{line} in {f.code.co_name}" + (f": `{text}`" if text else "")
