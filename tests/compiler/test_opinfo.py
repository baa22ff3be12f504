"""Op coverage: every op in torch's OpInfo database, compiled by kiln's compiler, against eager.

For each op and dtype (CPU; float32 and int64), the first few sample inputs that run in eager
become calls in an fx graph (non-tensor arguments baked in), compiled with
`kiln.compiler.compile_fx`; to fit the time budget, BATCH op/dtype cases share one graph (see
`Sweep`). Each op must either be lowered to kiln kernels or fall back to aten, and match eager:
outputs and the inputs' state after the call, with assert_close's defaults for the dtype as
OpInfo's own tests use (float32: rtol 1.3e-6, atol 1e-5; integers exact). Values are not compared
where they cannot be: random ops and non-deterministic outputs (e.g. `empty_like`) are checked
for structure, shape and dtype only. Known failures live in `opinfo_known_failures.py` (strict xfail).

At the end the sweep prints "opinfo sweep: lowered N / fallback M / failing K"; set
KILN_OPINFO_REPORT=path.json to also write the per-op outcome. KILN_OPINFO_INNER=eager runs the
aot step alone (aten graphs executed by torch), to tell aot bugs from lowering bugs.
"""
import collections
import dataclasses
import json
import os
import traceback

import pytest
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.testing._internal.common_methods_invocations import op_db

from kiln.compiler import compile_fx
from kiln.compiler.aot import AotUnsupported, trace_aten
from tests.compiler.opinfo_known_failures import KNOWN_FAILURES

INNER = os.environ.get("KILN_OPINFO_INNER", "cpp")
DTYPES = (torch.float32, torch.int64)
SAMPLES_PER_OP = 2
BATCH = 24  # cases per compiled graph: one C++ build for many ops keeps the sweep in budget
WHOLE_GRAPH = "<whole graph>"  # in kiln_fallbacks: the compiler ran the whole graph eagerly


def op_key(op):
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def known_failure(op, dtype):
    key = op_key(op)
    return KNOWN_FAILURES.get(f"{key}[{dtype_name(dtype)}]") or KNOWN_FAILURES.get(key)


def cases():
    for op in op_db:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype in supported:
                reason = known_failure(op, dtype)
                marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
                yield pytest.param(op, dtype, id=f"{op_key(op)}[{dtype_name(dtype)}]", marks=marks)


# ---- one sample as a graph call ----------------------------------------------------------------

@dataclasses.dataclass
class SampleCall:
    """One sample of one op: its distinct tensors become graph inputs; `fn(*tensors)` rebuilds
    the full call (non-tensor arguments baked in) and runs the op."""
    tensors: list
    fn: object


def sample_call(op, sample):
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors, slots, seen = [], [], {}
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) not in seen:  # a tensor passed twice stays one input (aliasing as eager)
                seen[id(leaf)] = len(tensors)
                tensors.append(leaf)
            slots.append(seen[id(leaf)])
        else:
            slots.append(None)

    def call_op(*ts):
        filled = [leaf if slot is None else ts[slot] for leaf, slot in zip(leaves, slots)]
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op.op(inp, *args, **kwargs)

    call_op.__name__ = "call_" + "".join(c if c.isalnum() else "_" for c in op_key(op))
    return SampleCall(tensors, call_op)


def build_graph(calls):
    """One GraphModule calling every sample; its inputs are all samples' tensors, in order."""
    graph = torch.fx.Graph()
    outputs = []
    for k, call in enumerate(calls):
        inputs = [graph.placeholder(f"s{k}_t{i}") for i in range(len(call.tensors))]
        outputs.append(graph.call_function(call.fn, tuple(inputs)))
    graph.output(tuple(outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# ---- eager reference ---------------------------------------------------------------------------

def fresh(tensors):
    return [t.detach().clone() for t in tensors]


def run_seeded(fn, tensors):
    """(output, inputs after the call) of fn on copies of `tensors`, under torch.manual_seed(0)."""
    args = fresh(tensors)
    torch.manual_seed(0)
    return fn(*args), args


def identical(a, b):
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return True
    except (AssertionError, TypeError, ValueError):
        return False


@dataclasses.dataclass
class Reference:
    """What eager gives for one sample, and whether its values can be compared."""
    call: SampleCall
    state: tuple          # (output, inputs after the call)
    values_comparable: bool


UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}


class ValueSourceRecorder(TorchDispatchMode):
    """Notes whether eager ran an op whose values kiln cannot be expected to reproduce: a random
    op (kiln draws its own numbers, even where the OpInfo wrapper reseeds torch), or one that
    returns uninitialized memory."""

    def __init__(self):
        super().__init__()
        self.unreproducible = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (torch.Tag.nondeterministic_seeded in func.tags
                or func.overloadpacket.__name__ in UNINITIALIZED):
            self.unreproducible = True
        return func(*args, **(kwargs or {}))


def eager_reference(call):
    """None when eager raises on this sample."""
    recorder = ValueSourceRecorder()
    try:
        with recorder:
            first = run_seeded(call.fn, call.tensors)
        again = run_seeded(call.fn, call.tensors)
    except Exception:
        return None
    comparable = not recorder.unreproducible and identical(first, again)
    return Reference(call, first, comparable)


# ---- comparison --------------------------------------------------------------------------------

def mismatch(actual, expected, values_comparable):
    """None when `actual` matches eager's `expected`, else what differs."""
    try:
        if values_comparable:
            torch.testing.assert_close(actual, expected, equal_nan=True)
            return None
        actual_leaves, actual_spec = pytree.tree_flatten(actual)
        expected_leaves, expected_spec = pytree.tree_flatten(expected)
        assert actual_spec == expected_spec, (actual_spec, expected_spec)
        for a, e in zip(actual_leaves, expected_leaves):
            if isinstance(e, torch.Tensor):
                assert isinstance(a, torch.Tensor) and (a.shape, a.dtype) == (e.shape, e.dtype), (a, e)
    except AssertionError as e:
        return f"wrong answer{'' if values_comparable else ' (structure/shape/dtype)'}: {e}"
    return None


# ---- the sweep: cases compiled in batches ------------------------------------------------------

@dataclasses.dataclass
class Case:
    """One op at one dtype, and (once prepared) the eager references of its samples."""
    id: str
    op: object
    dtype: torch.dtype
    samples: list = dataclasses.field(default_factory=list)

    def prepare(self):
        for sample in self.op.sample_inputs("cpu", self.dtype, requires_grad=False):
            reference = eager_reference(sample_call(self.op, sample))
            if reference is not None:
                self.samples.append(reference)
            if len(self.samples) == SAMPLES_PER_OP:
                break

    @property
    def tensors(self):
        return [t for r in self.samples for t in r.call.tensors]


@dataclasses.dataclass
class Verdict:
    outcome: str     # "lowered" | "fallback" | "unknown" (no inspection API) | "failing" | "skipped"
    detail: str = ""


class Sweep:
    """Compiles the selected cases BATCH at a time, in one graph per batch: one C++ build serves
    many ops. A batch that fails to compile or run is bisected down to the failing cases; a case
    whose answer is wrong is compiled alone too, to tell a lowering bug from an interaction
    between ops in one graph."""

    def __init__(self, cases):
        self.cases = cases
        self.verdicts = {}

    def verdict(self, case_id):
        if case_id not in self.verdicts:
            position = next(i for i, c in enumerate(self.cases) if c.id == case_id)
            start = position - position % BATCH
            self.run_batch(self.cases[start:start + BATCH])
        return self.verdicts[case_id]

    def run_batch(self, cases):
        runnable = []
        for case in cases:
            case.prepare()
            if case.samples:
                runnable.append(case)
            else:
                self.verdicts[case.id] = Verdict("skipped", "eager raises on every sample")
        if runnable:
            self.verdicts.update(check_together(runnable))


def check_together(cases):
    """{case id: Verdict} for `cases` compiled into one graph."""
    try:
        compiled, outputs, args = compile_and_run(cases)
    except Exception:
        error = traceback.format_exc()
    else:
        error = None
    if error and len(cases) == 1:
        return {cases[0].id: Verdict("failing", error)}
    if error or (len(cases) > 1 and WHOLE_GRAPH in getattr(compiled, "kiln_fallbacks", ())):
        # Split (outside the except block, so tracebacks do not chain): to find the failing
        # case, or the one that sent the whole graph to eager, without blaming the others.
        return {k: v for group in split(cases, whole_graph=error is None) for k, v in check_together(group).items()}
    verdicts, recheck = {}, []
    fallbacks, unsure = fallbacks_by_case(compiled, cases)
    for case, case_outputs, case_args in split_by_case(cases, outputs, args):
        problem = None
        for reference, output, after in zip(case.samples, case_outputs, case_args):
            problem = problem or mismatch((output, after), reference.state, reference.values_comparable)
        if problem and len(cases) > 1:
            alone = check_together([case])[case.id]
            if alone.outcome != "failing":
                others = ", ".join(c.id for c in cases if c is not case)
                problem += f"\n(right when compiled alone: wrong only in one graph with {others})"
            else:
                problem = alone.detail
        if problem:
            verdicts[case.id] = Verdict("failing", problem)
        elif case.id in unsure and len(cases) > 1:
            recheck.append(case)
        elif fallbacks is None:
            verdicts[case.id] = Verdict("unknown")
        elif fallbacks[case.id]:
            verdicts[case.id] = Verdict("fallback", "through aten: " + ", ".join(fallbacks[case.id]))
        else:
            verdicts[case.id] = Verdict("lowered")
    # Unsure attributions: the unsure cases again in a smaller graph (halves if all were unsure).
    groups = [recheck] if len(recheck) < len(cases) else [recheck[:len(recheck) // 2], recheck[len(recheck) // 2:]]
    for group in groups:
        if group:
            verdicts.update(check_together(group))
    return verdicts


def split(cases, whole_graph):
    """Groups to compile apart. For a graph the compiler ran eagerly as a whole, the cases that
    make it do so (found by tracing each alone: no C++ build) go alone and the rest together;
    otherwise, and if that finds none, halves."""
    suspects = [c for c in cases if whole_graph and needs_eager(c)]
    if 0 < len(suspects) < len(cases):
        return [[c] for c in suspects] + [[c for c in cases if c not in suspects]]
    half = len(cases) // 2
    return [cases[:half], cases[half:]]


def needs_eager(case):
    """Whether `case` alone makes a graph kiln cannot compile: aot refuses it, or its aten graph
    computes sizes or Python scalars from tensor data."""
    try:
        aten = trace_aten(build_graph([r.call for r in case.samples]), fresh(case.tensors))
    except AotUnsupported:
        return True
    for node in aten.gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape)):
            return True
    return False


def compile_and_run(cases):
    gm = build_graph([r.call for case in cases for r in case.samples])
    inputs = [t for case in cases for t in case.tensors]
    compiled = compile_fx(gm, fresh(inputs), inner=INNER)
    args = fresh(inputs)
    torch.manual_seed(0)
    return compiled, compiled(*args), args


def split_by_case(cases, outputs, args):
    """(case, its samples' outputs, its samples' inputs after the call) for each case."""
    outputs, start = iter(outputs), 0
    for case in cases:
        case_outputs, case_args = [], []
        for reference in case.samples:
            case_outputs.append(next(outputs))
            case_args.append(args[start:start + len(reference.call.tensors)])
            start += len(reference.call.tensors)
        yield case, case_outputs, case_args


def fallbacks_by_case(compiled, cases):
    """({case id: names of its aten ops that ran through aten}, ids whose attribution is unsure);
    (None, set()) without the inspection API.

    kiln_fallbacks names ops, one entry per node sent to aten: an op name with as many entries
    as nodes in the graph is a fallback wherever it occurs; one with fewer leaves unsure which
    of its cases fell back.
    """
    fallbacks = getattr(compiled, "kiln_fallbacks", None)
    if fallbacks is None:
        return None, set()
    if WHOLE_GRAPH in fallbacks:
        return {case.id: [WHOLE_GRAPH] for case in cases}, set()
    aten = compiled.kiln_aten
    fallback_count = collections.Counter(fallbacks)
    node_count = collections.Counter(str(n.target) for n in aten.gm.graph.nodes if n.op == "call_function")
    partly = {name for name, count in fallback_count.items() if count < node_count[name]}
    owner = []  # case index of each graph output, in order
    for k, case in enumerate(cases):
        for reference in case.samples:
            owner += [k] * len(pytree.tree_flatten(reference.state[0])[0])
    input_owner = [k for k, case in enumerate(cases) for _ in case.tensors]
    owner += [input_owner[i] for i in aten.mutated_inputs]
    names = {case.id: set() for case in cases}
    for k, out in zip(owner, aten.gm.graph.output_node().args[0]):
        if isinstance(out, torch.fx.Node):
            names[cases[k].id].update(str(n.target) for n in ancestors(out) if str(n.target) in fallback_count)
    unsure = {case_id for case_id, found in names.items() if found & partly}
    return {case_id: sorted(found) for case_id, found in names.items()}, unsure


def ancestors(node):
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


@pytest.fixture(scope="module")
def sweep(request):
    selected = [item for item in request.session.items
                if getattr(item, "originalname", None) == "test_op" and item.module.__name__ == __name__]
    sweep = Sweep([Case(item.callspec.id, item.callspec.params["op"], item.callspec.params["dtype"])
                   for item in selected])
    yield sweep
    outcomes = [v.outcome for v in sweep.verdicts.values()]
    line = (f"opinfo sweep: lowered {outcomes.count('lowered')} / fallback {outcomes.count('fallback')} / "
            f"failing {outcomes.count('failing')} (skipped {outcomes.count('skipped')}, "
            f"of {len(outcomes)} op/dtype cases; {len(KNOWN_FAILURES)} known failures)")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + line)
    path = os.environ.get("KILN_OPINFO_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"summary": line, "cases": {k: dataclasses.asdict(v) for k, v in sweep.verdicts.items()}},
                      f, indent=1, sort_keys=True)


@pytest.mark.parametrize("op, dtype", list(cases()))
def test_op(op, dtype, sweep, request):
    verdict = sweep.verdict(request.node.callspec.id)
    if verdict.outcome == "skipped":
        pytest.skip(verdict.detail)
    if verdict.outcome == "failing":
        pytest.fail(verdict.detail, pytrace=False)


# ---- the sweep checks itself: a wrong or crashing compiler must show up on the right op -------

def broken_compiler(wrong_op, crashing_op):
    """A stand-in for compile_fx (without the inspection API): adds 1 to every result of graphs
    that call `wrong_op`, raises on graphs that call `crashing_op`, runs other graphs as they are."""
    def compile(gm, example_inputs, inner):
        called = {n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"}
        if f"call_{crashing_op}" in called:
            raise RuntimeError(f"cannot compile {crashing_op}")

        def run(*args):
            out = gm(*args)
            if f"call_{wrong_op}" in called:
                out = pytree.tree_map(lambda t: t + 1 if isinstance(t, torch.Tensor) else t, out)
            return out
        return run
    return compile


def test_sweep_blames_the_right_ops(monkeypatch):
    monkeypatch.setitem(globals(), "compile_fx", broken_compiler("neg", "exp"))
    ops = {op.name: op for op in op_db if op.name in ("abs", "neg", "exp", "sin") and not op.variant_test_name}
    sweep = Sweep([Case(name, ops[name], torch.float32) for name in ("abs", "neg", "exp", "sin")])
    outcome = {name: sweep.verdict(name) for name in ("abs", "neg", "exp", "sin")}
    assert outcome["neg"].outcome == "failing" and "wrong answer" in outcome["neg"].detail
    assert outcome["exp"].outcome == "failing" and "cannot compile exp" in outcome["exp"].detail
    # abs shares a graph with neg, whose +1 reaches every output: right alone, so an interaction
    assert outcome["abs"].outcome == "failing" and "right when compiled alone" in outcome["abs"].detail
    assert outcome["sin"].outcome == "unknown"  # right, split from exp; the stand-in has no inspection API
