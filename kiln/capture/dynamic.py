"""Which tensor dimensions and Python numbers capture makes symbolic, and why.

The user marks dims with `kiln.mark_dynamic` / `kiln.mark_static` (stored on the tensor object, as
torch does, so a mark follows the tensor into nested and resume frames). `dims_for` merges the marks
with the compile's `dynamic` setting and automatic dynamic (sizes that changed between calls):
mark_static beats everything; sizes 0 and 1 always stay static, because broadcasting treats them
differently from every other size.
"""
import torch

from kiln.capture.sources import AttrSource, CellSource, ItemSource, LocalSource
from kiln.debug.logs import log
from kiln.exc import ConstraintViolation, InvalidArgument

_DYNAMIC_ATTR = "_kiln_dynamic_dims"  # {dim: (min, max)} set by mark_dynamic
_STATIC_ATTR = "_kiln_static_dims"    # {dim} set by mark_static


def mark_dynamic(t, dim, min=None, max=None):
    """Make `t`'s dimension(s) `dim` symbolic from the first compile, within [min, max] when given.

    Capture raises kiln.ConstraintViolation if the program forces such a dim to one size (or, with
    bounds, to a narrower range); a later tensor outside [min, max] does not match the entry.
    """
    for d in _dims(t, dim, "mark_dynamic"):
        if min is not None and max is not None and min > max:
            raise InvalidArgument(f"mark_dynamic: min={min} is greater than max={max}")
        marks = t.__dict__.setdefault(_DYNAMIC_ATTR, {})
        marks[d] = (min, max)
        t.__dict__.get(_STATIC_ATTR, set()).discard(d)


def mark_static(t, dim):
    """Keep `t`'s dimension(s) `dim` at their size in every compile, even under dynamic=True."""
    for d in _dims(t, dim, "mark_static"):
        t.__dict__.setdefault(_STATIC_ATTR, set()).add(d)
        t.__dict__.get(_DYNAMIC_ATTR, {}).pop(d, None)


def _dims(t, dim, who):
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{who} expects a tensor, got {type(t).__name__}")
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    out = []
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < t.dim():
            raise InvalidArgument(f"{who}: dim {d!r} is out of range for a {t.dim()}-d tensor")
        out.append(d % t.dim())
    return out


def marked_bounds(t):
    """{dim: (min, max)} of the dims marked dynamic on `t`."""
    return t.__dict__.get(_DYNAMIC_ATTR, {})


class InputDynamism:
    """For one code object: what its next compile makes symbolic. Holds the compile's `dynamic` setting
    and what automatic dynamic saw change between calls (tensor sizes; ints and floats, as torch 2.13:
    a number that changes becomes an input of the graph instead of a constant folded into it)."""

    def __init__(self, dynamic, frame):
        self.dynamic, self.frame = dynamic, frame
        self.changed_dims = {}        # Source -> dims whose size changed between calls
        self.changed_scalars = set()  # Sources of ints/floats whose value changed between calls

    def dims(self, source, t):
        """{dim: reason} of the dims of tensor `t` that become symbolic."""
        return dims_for(self.dynamic, self.changed_dims.get(source, ()), t, source, self.frame)

    def scalar(self, source, value):
        """Why the int or float `value` (reached through `source`) is symbolic, or None: it is folded in.

        As in torch.compile, only numbers the caller passes (arguments, the frame's closure, what is
        reached through them) can vary: globals and module attributes are configuration and stay
        constants (bools too), and dynamic=False keeps everything static. So do the int defaults of a
        function passed in (configuration too: torch.compile specializes them)."""
        if type(value) not in (int, float) or self.dynamic is False or not _from_caller(source) or \
                type(value) is int and _from_defaults(source):
            return None
        if value != value or value in (float("inf"), float("-inf")):
            return None  # the ShapeEnv cannot reason about nan and infinities
        if self.dynamic is True:
            why = "dynamic=True"
        elif source in self.changed_scalars:
            why = "automatic dynamic (its value changed between calls)"
        else:
            return None
        log("dynamic", "%s: %r = %r is symbolic: %s", self.frame, source, value, why)
        return why

    def has_changes(self):
        """Whether automatic dynamic saw a size or number change (the next capture makes it symbolic)."""
        return bool(self.changed_dims or self.changed_scalars)

    def note_changes(self, entries, value_of):
        """Automatic dynamic at a recompile: sizes and numbers that differ from what an earlier entry
        was compiled for become symbolic. `value_of(source)` reloads an input (or raises)."""
        if self.dynamic is not None or not _automatic():
            return
        for entry in entries:
            for source, seen in entry.input_values:
                try:
                    value = value_of(source)
                except Exception:
                    continue
                if isinstance(seen, tuple):
                    self._note_size(source, seen, value)
                elif type(value) is type(seen) and value != seen and source not in self.changed_scalars:
                    self.changed_scalars.add(source)
                    log("dynamic", "%s: %r changed %r -> %r: symbolic at the recompile", self.frame, source,
                        seen, value)

    def _note_size(self, source, shape, value):
        if isinstance(value, torch.Tensor) and value.dim() == len(shape):
            changed = {d for d, (a, b) in enumerate(zip(value.shape, shape)) if a != b}
            dims = self.changed_dims.setdefault(source, set())
            if not changed <= dims:
                dims |= changed
                log("dynamic", "%s: %r size changed %s -> %s: dims %s become dynamic at the recompile",
                    self.frame, source, list(shape), list(value.shape), sorted(dims))


def _automatic():
    from kiln.config import config
    return config.automatic_dynamic_shapes


def _from_caller(source):
    """Whether `source` starts at the frame's arguments or its own closure cells."""
    while isinstance(source, (AttrSource, ItemSource)):
        source = source.base
    return isinstance(source, LocalSource) or isinstance(source, CellSource)


def _from_defaults(source):
    """Whether `source` is reached through a function's __defaults__ or __kwdefaults__."""
    while isinstance(source, (AttrSource, ItemSource)):
        if isinstance(source, AttrSource) and source.name in ("__defaults__", "__kwdefaults__"):
            return True
        source = source.base
    return False


def dims_for(dynamic, changed, t, source, frame):
    """{dim: reason} of the dims of `t` (reached through `source` in the frame named `frame`) that
    become symbolic. `dynamic` is the compile's setting; `changed` the dims automatic dynamic saw
    change size."""
    marks, static = marked_bounds(t), t.__dict__.get(_STATIC_ATTR, ())
    wanted = {d: "kiln.mark_dynamic" + _bounds_text(marks[d]) for d in marks}
    if dynamic is True and not is_module_state(t, source):
        wanted.update({d: "dynamic=True" for d in range(t.dim()) if d not in wanted})
    elif dynamic is None:
        # dims seen changing on an earlier tensor from this source that had more dims do not apply
        wanted.update({d: "automatic dynamic (its size changed between calls)" for d in changed
                       if d not in wanted and d < t.dim()})
    dims = {}
    for d, why in sorted(wanted.items()):
        _check_bounds(t, d, marks.get(d), source)
        if d in static:
            log("dynamic", "%s: %r dim %d stays static: kiln.mark_static", frame, source, d)
        elif t.shape[d] in (0, 1):
            log("dynamic", "%s: %r dim %d stays static: its size is %d (sizes 0 and 1 broadcast differently)",
                frame, source, d, t.shape[d])
        else:
            log("dynamic", "%s: %r dim %d (size %d) is dynamic: %s", frame, source, d, t.shape[d], why)
            dims[d] = why
    return dims


def is_module_state(t, source):
    """Parameters and module buffers keep their sizes under dynamic=True (as in torch.compile): they
    rarely change, and symbols for them would only add guards."""
    if isinstance(t, torch.nn.Parameter):
        return True
    base = getattr(source, "base", None)
    return isinstance(source, ItemSource) and isinstance(base, AttrSource) and base.name == "_buffers"


def _check_bounds(t, d, bounds, source):
    low, high = bounds or (None, None)
    size = t.shape[d]
    if (low is not None and size < low) or (high is not None and size > high):
        raise ConstraintViolation(f"{source!r}.size()[{d}] = {size} is not in the range [{low}, {high}] given to "
                                  f"kiln.mark_dynamic", source=source, dim=d)


def _bounds_text(bounds):
    low, high = bounds
    return "" if low is None and high is None else f" in [{low}, {high}]"


def symbolic_context(t, dims):
    """The ShapeEnv context for `t`: its dims in `dims` symbolic; mark_dynamic bounds as ranges."""
    # (symbolic_shapes imports sympy: it loads with the first compile, not with kiln)
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext
    marks = marked_bounds(t)
    constraints = [_constraint(marks[d]) if d in marks else None for d in range(t.dim())]
    return StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())],
        constraint_sizes=constraints if any(constraints) else None)


def _constraint(bounds):
    from torch.fx.experimental.symbolic_shapes import RelaxedUnspecConstraint, StrictMinMaxConstraint
    from torch.utils._sympy.numbers import int_oo  # torch's own infinity bounds integer ranges
    from torch.utils._sympy.value_ranges import ValueRanges
    low, high = bounds
    if low is None and high is None:
        return RelaxedUnspecConstraint(warn_only=False)
    # symbols never take 0 or 1 (those sizes are specialized), so 2 is the lowest meaningful bound
    upper = high if high is not None else int_oo
    return StrictMinMaxConstraint(vr=ValueRanges(lower=2 if low is None or low < 2 else low, upper=upper),
                                  warn_only=False)
