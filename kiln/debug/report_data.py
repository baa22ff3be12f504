"""The compile report's data: what kiln did in one process, as plain dataclasses.

`kiln.debug.report` fills these from hooks in the runtime, capture and compiler; `report_html`
renders them. Tests read this data, never the HTML.
"""
import dataclasses
import time


@dataclasses.dataclass
class GraphBreak:
    kind: str              # a kiln.debug.break_kinds name
    message: str
    where: str | None      # "file:line" of the user's code
    line_text: str         # that line's source
    explanation: str
    hint: str


@dataclasses.dataclass
class GuardFailure:
    entry: int             # which cache entry's guard failed
    guard: str             # the guard's text
    source: str | None     # what it checks (L['x'])
    old: str               # the value the entry was compiled for, when known
    new: str               # the value of this call


@dataclasses.dataclass
class Recompile:
    frame: str             # qualname (file:line)
    failures: list         # GuardFailure, one per existing entry


@dataclasses.dataclass
class Kernel:
    name: str
    buffers: list          # IR buffer names it computes
    aten_ops: list         # aten ops it came from, in graph order
    user_lines: list       # the user's lines those ops came from
    code: str              # its C++


@dataclasses.dataclass
class CompiledGraph:
    """What kiln's compiler made of one aten graph (training: a forward and a backward)."""
    aten_code: str
    ir_text: str
    schedule_text: str
    kernels: list          # Kernel
    externs: list          # "target (why)" of ops called through aten
    source: str            # the whole C++ translation unit
    wrapper: str
    stage_seconds: dict    # stage -> seconds (aot, lowering, scheduling, codegen, build)
    from_cache: bool = False


@dataclasses.dataclass
class Graph:
    index: int             # graph number in the report
    op_count: int
    ops: list              # torch-level op names, in order
    fx_code: str
    svg: str | None        # the graph drawn (graphviz), when available
    compiled: list         # CompiledGraph (empty for backends other than kiln's compiler)


@dataclasses.dataclass
class Frame:
    """One compile of one frame: a new cache entry, or a frame left to run eagerly."""
    qualname: str
    filename: str
    firstlineno: int
    entry_index: int                          # its place in the code object's cache
    seconds: float = 0.0                      # the whole compile (capture + backend)
    graph: Graph | None = None
    graph_break: GraphBreak | None = None
    guards: list = dataclasses.field(default_factory=list)     # guard texts
    dynamic_dims: list = dataclasses.field(default_factory=list)  # "L['x'].size()[0] = s0"
    pinned_sizes: list = dataclasses.field(default_factory=list)  # (what was pinned and how, the user's line)
    eager_reason: str | None = None
    # compiler results and stage times gathered while this frame compiles
    pending_compiled: list = dataclasses.field(default_factory=list, repr=False)
    pending_stages: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def stage_seconds(self):
        """capture (everything but the backend) and the backend's stages."""
        stages = dict(self.pending_stages)  # (what no compiled graph took with it: training's aot)
        for c in (self.graph.compiled if self.graph else self.pending_compiled):
            for k, v in c.stage_seconds.items():
                stages[k] = stages.get(k, 0.0) + v
        stages = {"capture": max(self.seconds - sum(stages.values()), 0.0), **stages}
        return stages


@dataclasses.dataclass
class Report:
    started: float = dataclasses.field(default_factory=time.time)
    frames: list = dataclasses.field(default_factory=list)       # Frame, in compile order
    recompiles: list = dataclasses.field(default_factory=list)   # Recompile

    @property
    def graphs(self):
        return [f.graph for f in self.frames if f.graph is not None]

    @property
    def graph_breaks(self):
        """Each break once: a break inside an inlined call also breaks every frame around it."""
        seen, out = set(), []
        for f in self.frames:
            b = f.graph_break
            if b is not None and (b.message, b.where) not in seen:
                seen.add((b.message, b.where))
                out.append(b)
        return out

    @property
    def kernels(self):
        return [k for g in self.graphs for c in g.compiled for k in c.kernels]

    def stage_seconds(self):
        total = {}
        for f in self.frames:
            for k, v in f.stage_seconds.items():
                total[k] = total.get(k, 0.0) + v
        return total
