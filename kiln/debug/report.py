"""The compile report: one self-contained HTML page per process saying what kiln did.

`KILN_REPORT=DIR` writes DIR/kiln_report_<pid>.html when the process exits; `kiln.report(path)` is
the same for one block of code (`with kiln.report("out.html") as data: ...`, `path=None` writes
nothing: the data alone, what tests read).

The data (report_data) is gathered by hooks that cost one check when no report is on:
- the runtime: `frame_compiling` around each compile, `entry_made`, `frame_eager`, `recompiling`;
- the compiler: `stage(name)` around aot, lowering, scheduling, codegen and build, `graph_compiled`.
"""
import atexit
import contextlib
import linecache
import os
import pathlib
import time

from kiln.debug import break_kinds, report_data as data

_active = []   # the Reports being filled (KILN_REPORT's and any kiln.report blocks)
_frames = []   # the Frames being compiled, innermost last (one per active compile)


def active():
    return bool(_active)


# ---- hooks: the runtime ------------------------------------------------------------------------
class FrameRecording:
    """Around one compile of a frame (`with frame_compiling(code, n) as rec:`): what the compile makes
    (graphs, kernels, stage times) is recorded on `rec.frame`; the runtime then says how it ended
    (`entry_made` or `frame_eager`)."""

    def __init__(self, code, entry_index):
        self.code = code
        self.frame = data.Frame(code.co_qualname, code.co_filename, code.co_firstlineno, entry_index)
        self.start = 0.0

    def __enter__(self):
        _frames.append(self.frame)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.frame.seconds = time.perf_counter() - self.start
        _frames.remove(self.frame)
        return False


class _NotRecording:
    frame = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NOT_RECORDING = _NotRecording()


def frame_compiling(code, entry_index):
    return FrameRecording(code, entry_index) if _active else _NOT_RECORDING


def _current_frame():
    return _frames[-1] if _frames else None


def entry_made(recording, entry):
    frame = recording.frame
    if frame is None:
        return
    frame.guards = [g.text for g in entry.guards]
    if entry.break_reason is not None:
        frame.graph_break = graph_break(entry.break_reason)
    if entry.graph is not None:
        frame.graph = _graph(entry.graph, frame.pending_compiled)
        frame.dynamic_dims = dynamic_dims(entry.graph)
    frame.pending_compiled = []
    _record(frame)


def frame_eager(recording, reason):
    frame = recording.frame
    if frame is None:
        return
    frame.eager_reason = reason
    kind = break_kinds.get("frame_runs_eagerly")
    frame.graph_break = data.GraphBreak(kind.name, reason, f"{frame.filename}:{frame.firstlineno}",
                                        linecache.getline(frame.filename, frame.firstlineno).strip(),
                                        kind.explanation, kind.hint)
    _record(frame)


def size_pinned(what, where):
    """Capture found a dynamic size forced to one value (or tied to another) by the user's line `where`."""
    frame = _current_frame() if _active else None
    if frame is not None and (what, where) not in frame.pinned_sizes:  # (capture may run a frame twice)
        frame.pinned_sizes.append((what, where))


def _record(frame):
    for report in _active:
        report.frames.append(frame)


def recompiling(code, entries, F, L, evaluate):
    """A call missed every entry of `code`: record, per entry, the guard that failed and its values."""
    if not _active:
        return
    failures = []
    for i, entry in enumerate(entries):
        guard = entry.first_failure(F, L)
        source = getattr(guard, "source", None)
        old = next((value for s, value in entry.input_values if repr(s) == repr(source)), None)
        try:
            new = _value_text(evaluate(source, F, L)) if source is not None else "?"
        except Exception as e:  # noqa: BLE001 (a report must not break the program)
            new = f"<{type(e).__name__}>"
        failures.append(data.GuardFailure(i, getattr(guard, "text", str(guard)), None if source is None else repr(source),
                                          "see guard" if old is None else _value_text(old), new))
    where = f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
    for report in _active:
        report.recompiles.append(data.Recompile(where, failures))


def _value_text(value):
    import torch
    if isinstance(value, torch.Tensor):
        return f"size {list(value.shape)}, {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        return f"size {list(value)}"
    text = repr(value)
    return text if len(text) < 200 else text[:200] + "..."


def graph_break(error):
    kind = break_kinds.get(getattr(error, "kind", None) or "other")
    where = error.where
    line_text = ""
    if where and ":" in where:
        filename, _, line = where.rpartition(":")
        if line.isdigit():
            line_text = linecache.getline(filename, int(line)).strip()
    return data.GraphBreak(kind.name, error.msg, where, line_text, kind.explanation, kind.hint)


def dynamic_dims(gm):
    """`L['x'].size()[1] = s0` for each placeholder size that is symbolic."""
    import torch
    out = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value, source = node.meta.get("example_value"), node.meta.get("source", node.name)
        if isinstance(value, torch.Tensor):
            out += [f"{source}.size()[{d}] = {s}" + (" (made dynamic, then pinned)" if str(s).isdigit() else "")
                    for d, s in enumerate(value.shape) if isinstance(s, torch.SymInt)]
        elif isinstance(value, (torch.SymInt, torch.SymFloat)):
            out.append(f"{source} = {value}")
    return out


def _graph(gm, compiled):
    from kiln.debug.diagram import fx_svg
    calls = [n for n in gm.graph.nodes if n.op.startswith("call")]
    index = len(_active[0].graphs) if _active else 0
    return data.Graph(index, len(calls), [_op_name(n.target) for n in calls], gm.code.strip(), fx_svg(gm),
                      list(compiled))


def _op_name(target):
    return getattr(target, "__name__", None) or str(target)


# ---- hooks: the compiler -----------------------------------------------------------------------
_stage_children = []  # per stage being timed: the seconds its nested stages took (counted there, not here)


@contextlib.contextmanager
def stage(name):
    """Time one compiler stage of the frame being compiled (a stage inside another, lowering inside
    training's aot, counts for itself only)."""
    frame = _current_frame() if _active else None
    if frame is None:
        yield
        return
    start = time.perf_counter()
    _stage_children.append(0.0)
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        own = elapsed - _stage_children.pop()
        if _stage_children:
            _stage_children[-1] += elapsed
        frame.pending_stages[name] = frame.pending_stages.get(name, 0.0) + own


def graph_compiled(*, aten_gm, graph, program, source, wrapper_source):
    """kiln's compiler finished one aten graph: its IR, schedule, kernels and their provenance."""
    frame = _current_frame() if _active else None
    if frame is None:
        return
    from kiln.compiler.ir_printer import print_ir, print_schedule
    from kiln.compiler.provenance import kernel_origins, kernel_sources, op_name, user_line
    from kiln.compiler.schedule import Kernel
    origins = kernel_origins([k for k in program.steps if isinstance(k, Kernel)], graph)
    codes = kernel_sources(source, [k for k, _ in origins])
    kernels = [data.Kernel(kernel.name, [n.name for n in kernel.nodes], _unique(map(op_name, nodes)),
                           _unique(filter(None, map(user_line, nodes))), codes.get(kernel.name, ""))
               for kernel, nodes in origins]
    frame.pending_compiled.append(data.CompiledGraph(
        aten_gm.print_readable(print_output=False), print_ir(program, graph.origins), print_schedule(program), kernels,
        list(graph.fallbacks), source, wrapper_source, dict(frame.pending_stages)))
    frame.pending_stages.clear()


def _unique(items):
    return list(dict.fromkeys(items))


# ---- turning it on -----------------------------------------------------------------------------
@contextlib.contextmanager
def report(path=None):
    """`with kiln.report("out.html") as data:` records what kiln compiles in the block; writes the page
    to `path` (a directory gets kiln_report_<pid>.html) unless it is None. Yields the report data."""
    collected = data.Report()
    _active.append(collected)
    try:
        yield collected
    finally:
        _active.remove(collected)
        if path is not None:
            write(collected, path)


def write(collected, path):
    """Render `collected` into `path` (a file, or a directory for kiln_report_<pid>.html); returns the file."""
    from kiln.debug.report_html import render
    path = pathlib.Path(path)
    if path.suffix != ".html":
        path.mkdir(parents=True, exist_ok=True)
        path = path / f"kiln_report_{os.getpid()}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(collected))
    return path


def start_from_environment():
    """KILN_REPORT=DIR: record the whole process and write the page at exit."""
    target = os.environ.get("KILN_REPORT")
    if not target:
        return
    collected = data.Report()
    _active.append(collected)
    atexit.register(lambda: write(collected, target))
