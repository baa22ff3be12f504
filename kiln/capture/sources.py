"""Sources: where a value captured from the outside world came from.

A Source renders the Python expression that reloads the value at run time. The same expression is
used by the guard function (to check the value) and by the glue (to feed the graph and rebuild
Python values), so the two can never disagree.

Expressions are written against three names bound by the generated code:
  F  the function object of the frame (its __globals__ and __closure__),
  L  the tuple of the frame's bound arguments (or resume-function arguments),
  and constants (dicts, cells) that the CodeContext interns under names like C3.
"""
import weakref


class CodeContext:
    """Collects the constant objects a generated function refers to (bound as its globals)."""

    def __init__(self):
        self.consts = {}
        self._names = {}

    def sub(self, source):
        """The expression of a sub-source (the hoisting context of guards binds it to a local)."""
        return source.expr(self)

    def const(self, obj, hint="C"):
        key = id(obj)
        if key not in self._names:
            name = f"{hint}{len(self.consts)}"
            self._names[key] = name
            self.consts[name] = obj
        return self._names[key]


class Source:
    """Base class. Sources are immutable and hashable (by their expression shape)."""

    def expr(self, ctx):
        raise NotImplementedError

    def key(self):
        raise NotImplementedError

    def __eq__(self, other):
        return isinstance(other, Source) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        return self.expr(CodeContext())


class LocalSource(Source):
    """The frame's i-th bound argument."""

    def __init__(self, index, name):
        self.index, self.name = index, name

    def expr(self, ctx):
        return f"L[{self.index}]"

    def key(self):
        return ("L", self.index)

    def __repr__(self):
        return f"L['{self.name}']"


class GlobalSource(Source):
    """A global name. `root` globals are the frame function's (F.__globals__, so copies of a function
    with other globals stay right); an inlined callee's globals dict is fixed and interned."""

    def __init__(self, gdict, name, root):
        # root globals are read through F; not holding their dict keeps an entry from keeping alive
        # the namespace of the function it compiled (and whatever that namespace holds)
        self.gdict, self.name, self.root = (None if root else gdict), name, root
        self.namespace = id(gdict)  # which module's globals, also for root ones (side effects key by it)

    def expr(self, ctx):
        base = "G" if self.root else ctx.const(self.gdict, "GD")
        return f"{base}[{self.name!r}]"

    def key(self):
        return ("G", id(self.gdict), self.name, self.root)

    def __repr__(self):
        return f"G['{self.name}']"


class CellSource(Source):
    """The contents of a closure cell: the frame's i-th free variable. (An inlined function's cells are
    read through the function: fn.__closure__[i].cell_contents.)"""

    def __init__(self, name, index):
        self.name, self.index = name, index

    def expr(self, ctx):
        return f"F.__closure__[{self.index}].cell_contents"

    def key(self):
        return ("cell", self.index)

    def __repr__(self):
        return f"closure['{self.name}']"


class AttrSource(Source):
    def __init__(self, base, name):
        self.base, self.name = base, name

    def expr(self, ctx):
        return f"{ctx.sub(self.base)}.{self.name}"

    def key(self):
        return ("attr", self.base.key(), self.name)

    def __repr__(self):
        return f"{self.base!r}.{self.name}"


class ItemSource(Source):
    """base[key] for a constant key (an int or str written as is; others interned: torch.Size, a class, a
    tuple, ...)."""

    def __init__(self, base, index):
        self.base, self.index = base, index

    def expr(self, ctx):
        literal = type(self.index) in (int, str, bytes, bool, type(None))
        key = repr(self.index) if literal else ctx.const(self.index, "KEY")
        return f"{ctx.sub(self.base)}[{key}]"

    def key(self):
        return ("item", self.base.key(), self.index)

    def __repr__(self):
        return f"{self.base!r}[{self.index!r}]"


class ConstSource(Source):
    """A fixed object (a module's globals, a class): reloaded by identity, never guarded. Held weakly
    where it can be: a cache entry keeps its guards' sources, and must not keep what they read alive."""

    def __init__(self, obj):
        try:
            self._ref = weakref.ref(obj)
        except TypeError:
            self._ref = lambda: obj

    @property
    def obj(self):
        return self._ref()

    def expr(self, ctx):
        return ctx.const(self.obj)

    def key(self):
        return ("const", id(self.obj))

    def __repr__(self):
        name = getattr(self.obj, "__qualname__", None)
        return f"<{type(self.obj).__name__} {name}>" if isinstance(name, str) else f"<{type(self.obj).__name__}>"


class TupleSource(Source):
    """The tuple of several sources' values (a guard over a group: which input tensors alias)."""

    def __init__(self, sources):
        self.sources = tuple(sources)

    def expr(self, ctx):
        return "(" + "".join(ctx.sub(s) + ", " for s in self.sources) + ")"

    def key(self):
        return ("tuple",) + tuple(s.key() for s in self.sources)

    def __repr__(self):
        return "(" + ", ".join(repr(s) for s in self.sources) + ")"


class ConvertedSource(Source):
    """`fn(base)` for a pure conversion `fn` (torch.from_numpy of an ndarray that came from outside)."""

    def __init__(self, fn, base):
        self.fn, self.base = fn, base

    def expr(self, ctx):
        return f"{ctx.const(self.fn, 'CONV')}({ctx.sub(self.base)})"

    def key(self):
        return ("conv", id(self.fn), self.base.key())

    def __repr__(self):
        return f"{getattr(self.fn, '__name__', 'convert')}({self.base!r})"
