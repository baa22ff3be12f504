"""The Python source torch.fx keeps for the graph modules of one compile, freed with its cache entry.

torch.fx puts the generated code of every GraphModule it compiles (each `recompile`) in its loader's
table and in `linecache`, under `<eval_with_key>.N`, and never takes it out: a process compiling a
function per request grows by a few KB per graph module forever (torch.compile does). A compile made
inside `owned()` ties the keys it created to the entry it produced (`tie_to`): when the entry dies,
so do they. A compile that produces nothing drops them at once. Keys are told apart by their number,
so another thread using torch.fx during the same compile may lose a source line for its tracebacks,
never any behaviour.
"""
import contextlib
import linecache
import re
import weakref

try:
    from torch.fx.graph_module import _loader
except ImportError:  # a torch without fx's loader has nothing to free
    _loader = None

_KEY = re.compile(r"<eval_with_key>\.(\d+)")


class _Compile:
    def __init__(self):
        self.start = getattr(_loader, "next_id", None)
        self.tied = False

    def keys(self):
        """The loader keys created since this compile began."""
        table = getattr(_loader, "eval_cache", None)
        if self.start is None or not isinstance(table, dict):
            return []
        found = []
        for key in list(table):
            m = _KEY.match(key) if isinstance(key, str) else None
            if m and int(m.group(1)) >= self.start:
                found.append(key)
        return found

    def tie_to(self, owner):
        """Free this compile's sources when `owner` (the cache entry) is garbage collected."""
        self.tied = True
        keys = self.keys()
        if keys:
            weakref.finalize(owner, forget, keys)


@contextlib.contextmanager
def owned():
    compile_ = _Compile()
    try:
        yield compile_
    finally:
        if not compile_.tied:
            forget(compile_.keys())


def forget(keys):
    table = getattr(_loader, "eval_cache", None)
    for key in keys:
        if table is not None:
            table.pop(key, None)
        linecache.cache.pop(key, None)
