"""A compiled entry of a code object's cache: its guards, the glue that runs it, and what explain,
recompile messages and automatic dynamic read from it. Made by capture (convert.py) or loaded from
the capture cache on disk (capture_cache.py), logged alike either way."""
from kiln.debug.logs import enabled, log


class CacheEntry:
    __slots__ = ("check", "run", "guards", "first_failure", "graph", "break_reason", "glue_src", "guard_src",
                 "input_values", "liveness", "stored_form", "__weakref__")

    def __init__(self, check, run, guards, first_failure, graph, break_reason, glue_src, guard_src, input_values,
                 liveness, stored_form=None):
        self.check, self.run, self.guards, self.first_failure = check, run, guards, first_failure
        self.graph, self.break_reason, self.glue_src, self.guard_src = graph, break_reason, glue_src, guard_src
        # (Source, size tuple of a tensor input or value of a number folded in), for automatic dynamic
        self.input_values = input_values
        self.liveness = liveness  # the objects its guards check by identity (guards.Liveness)
        self.stored_form = stored_form  # what the capture cache writes to disk (None: kept in this process only)


def log_graph(code, gm):
    if enabled("graph"):
        log("graph", "graph for %s (%s:%d):\n%s", code.co_qualname, code.co_filename, code.co_firstlineno, gm.code)


def log_entry(code, entry, origin=""):
    if enabled("guards"):
        log("guards", "guards for %s (%s:%d)%s:\n%s", code.co_qualname, code.co_filename, code.co_firstlineno,
            origin, "\n".join(f"  {g.text}" for g in entry.guards))
    if enabled("bytecode"):
        log("bytecode", "glue for %s:\n%s", code.co_qualname, entry.glue_src)
