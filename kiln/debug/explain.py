"""`kiln.explain(fn)(*args)`: compile `fn` once on those arguments and report what capture did.

Uses a private backend, so its cache entries never mix with the user's (they are dropped after).
"""
from kiln.backends.registry import BoundBackend


class BreakReason:
    """One graph break: the message, the user's file:line, and its kind (kiln.debug.break_kinds)."""

    def __init__(self, reason, where, kind="other"):
        self.reason, self.where, self.kind = reason, where, kind

    def __str__(self):
        return f"{self.reason} (at {self.where})" if self.where and self.where not in self.reason else self.reason

    __repr__ = __str__


class ExplainOutput:
    def __init__(self, graphs, break_reasons, guards, eager_frames):
        self.graphs = graphs
        self.graph_count = len(graphs)
        self.break_reasons = break_reasons
        self.graph_break_count = len(break_reasons)
        self.ops_per_graph = [[n.target for n in gm.graph.nodes if n.op.startswith("call")] for gm in graphs]
        self.guards = guards
        self.eager_frames = eager_frames

    def __str__(self):
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {sum(len(o) for o in self.ops_per_graph)}", "Break Reasons:"]
        lines += [f"  Break Reason {i + 1} [{r.kind}]: {r}" for i, r in enumerate(self.break_reasons)]
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"  Graph {i + 1}: " + ", ".join(getattr(o, "__name__", str(o)) for o in ops))
        lines.append("Guards:")
        lines += [f"  {g}" for g in self.guards]
        if self.eager_frames:
            lines.append("Frames run eagerly:")
            lines += [f"  {r}" for r in self.eager_frames]
        return "\n".join(lines)

    __repr__ = __str__


def _guards_of(entries):
    """Every entry's guards; a global-state guard (grad mode, autocast) that each frame repeats is listed once."""
    seen, out = set(), []
    for g in (g for e in entries for g in e.guards):
        if g.source is None:
            if g.text in seen:
                continue
            seen.add(g.text)
        out.append(g)
    return out


def explain(fn, *args, **kwargs):
    """`explain(fn)(*args)` (or `explain(fn, *args)`): graphs, breaks with file:line, ops, guards."""
    if not args and not kwargs:
        return lambda *a, **k: explain(fn, *a, **k)
    from kiln.capture import optimize, runtime
    fn = getattr(fn, "_orig_mod", None) or getattr(fn, "__kiln_orig__", fn)
    graphs, entries, eager = [], [], []

    def record_graph(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend = BoundBackend("explain", record_graph)
    on_entry = lambda code, entry: entries.append(entry)  # noqa: E731
    on_eager = lambda code, reason: eager.append(reason)  # noqa: E731
    runtime.observers.append(on_entry)
    runtime.eager_observers.append(on_eager)
    try:
        optimize(fn, backend)(*args, **kwargs)
    finally:
        runtime.observers.remove(on_entry)
        runtime.eager_observers.remove(on_eager)
        runtime.forget_backend(backend)
    # a break inside an inlined call also breaks each enclosing frame at its call site; it is one
    # construct in the user's code, so it is reported once
    seen, reasons = set(), []
    for e in entries:
        if e.break_reason and (e.break_reason.msg, e.break_reason.where) not in seen:
            seen.add((e.break_reason.msg, e.break_reason.where))
            reasons.append(BreakReason(e.break_reason.msg, e.break_reason.where, e.break_reason.kind))
    reasons += [BreakReason(r, None, "frame_runs_eagerly") for r in eager]
    # returned, not printed, as torch._dynamo.explain does (str(out) is the report)
    return ExplainOutput(graphs, reasons, _guards_of(entries), eager)

