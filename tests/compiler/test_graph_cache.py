"""The compiled-graph cache: a graph compiled in one process loads in a fresh one without aot, and
gives eager's results; anything that changes the compiled graph gets its own entry; a damaged entry
is ignored. Eager is the oracle throughout.

`python -m tests.compiler.test_graph_cache SEED` is the child the fresh-process test runs twice:
it compiles a set of programs through `kiln.compile`, checks each against eager (values, mutated
inputs, module buffers, aliasing), and prints the graph cache counters per program as JSON.
"""
import copy
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from kiln.compiler import build, compile_fx, graph_cache

REPO = pathlib.Path(__file__).resolve().parents[2]
_MARK = "graph-cache-result "


# ---- programs (shared by the child and the in-process tests) --------------------------------------
def pointwise(x):
    return (x * 2).sin() + 1


def mutates_input(x, y):
    x.add_(y)
    return x * 2


def aliased_outputs(x):
    return x.t(), x[1], x + 1


def dict_outputs(x):
    return {"total": x.sum(), "shifted": x - 1, "pair": (x * 3, x.cos())}


def baked_constant(x):
    return x + torch.tensor([1.0, -2.0, 3.0])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x)))


def _same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _check_case(fn, make_args):
    """Run `fn` eagerly and compiled on equal inputs; compare outputs, inputs after the call, and
    which outputs share memory with the first input."""
    import kiln
    compiled = kiln.compile(fn)
    eager_args, kiln_args = make_args(), make_args()
    expected, got = fn(*eager_args), compiled(*kiln_args)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(kiln_args, eager_args)
    leaves = torch.utils._pytree.tree_leaves
    assert [_same_storage(e, eager_args[0]) for e in leaves(expected)] == \
        [_same_storage(g, kiln_args[0]) for g in leaves(got)]


def _check_module(seed):
    """A module in training mode under no_grad: BatchNorm's running stats are written back; an
    in-place change of a parameter between calls shows in the next result."""
    import kiln
    torch.manual_seed(seed)
    net = Net().train()
    twin = copy.deepcopy(net)
    compiled = kiln.compile(twin)
    x = torch.randn(5, 3)
    for step in range(2):
        torch.testing.assert_close(compiled(x), net(x))
        torch.testing.assert_close(dict(twin.named_buffers()), dict(net.named_buffers()))
        for m in (net, twin):
            m.lin.weight.mul_(-0.5)  # in place: the compiled graph must read the current values


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _child(seed):
    import kiln.compiler.aot as aot
    torch.manual_seed(seed)
    aot_calls = []
    trace = aot.trace_aten

    def counting_trace(*args, **kwargs):
        aot_calls.append(1)
        return trace(*args, **kwargs)
    aot.trace_aten = counting_trace  # the child's own copy: counts how often aot ran
    cases = {
        "pointwise": lambda: _check_case(pointwise, lambda: (torch.randn(4, 5, generator=_generator(seed)),)),
        "mutates_input": lambda: _check_case(mutates_input, lambda: (torch.ones(4) * seed, torch.arange(4.0))),
        "aliased_outputs": lambda: _check_case(aliased_outputs, lambda: (torch.arange(6.0).reshape(2, 3),)),
        "dict_outputs": lambda: _check_case(dict_outputs, lambda: (torch.linspace(-1, 1, 6).reshape(2, 3),)),
        "baked_constant": lambda: _check_case(baked_constant, lambda: (torch.full((2, 3), float(seed)),)),
        "module": lambda: _check_module(seed),
    }
    report = {}
    with torch.no_grad():
        for name, run in cases.items():
            before = dict(vars(graph_cache.stats))
            run()
            report[name] = {k: v - before[k] for k, v in vars(graph_cache.stats).items()}
    print(_MARK + json.dumps({"cases": report, "aot_calls": len(aot_calls)}), flush=True)


def _run_child(cache_dir, seed):
    env = {**os.environ, "KILN_CACHE_DIR": str(cache_dir)}
    env.pop("KILN_LOGS", None)
    done = subprocess.run([sys.executable, "-m", "tests.compiler.test_graph_cache", str(seed)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [l for l in done.stdout.splitlines() if l.startswith(_MARK)]
    return json.loads(line[len(_MARK):])


def test_fresh_process_loads_graphs_without_aot(tmp_path):
    cache_dir = tmp_path / "cache"
    cold = _run_child(cache_dir, seed=1)
    for name, counts in cold["cases"].items():
        assert counts["hits"] == 0 and counts["stores"] >= 1 and counts["uncacheable"] == 0, (name, counts)
    assert cold["aot_calls"] >= len(cold["cases"])
    # other parameter values and inputs (seed 2): results still follow eager, so nothing stale was baked
    warm = _run_child(cache_dir, seed=2)
    for name, counts in warm["cases"].items():
        assert counts["hits"] >= 1 and counts["misses"] == 0 and counts["stores"] == 0, (name, counts)
    assert warm["aot_calls"] == 0
    assert (cache_dir / "graphs").stat().st_mode & 0o777 == 0o700


# ---- in-process: what must not reuse an entry --------------------------------------------------
@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh private cache directory and fresh counters."""
    path = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    monkeypatch.setattr(graph_cache, "stats", graph_cache.GraphCacheStats())
    return path


def traced(fn):
    return torch.fx.symbolic_trace(fn)


def compile_and_check(fn, *args, options=None):
    """compile_fx `fn` (traced) for `args`; the result must equal eager."""
    compiled = compile_fx(traced(fn), list(args), options)
    torch.testing.assert_close(compiled(*args), fn(*args))
    return compiled


def counts():
    s = graph_cache.stats
    return s.hits, s.misses, s.stores


def test_second_compile_hits_and_matches_eager(cache):
    x = torch.randn(3, 4)
    compile_and_check(pointwise, x)
    assert counts() == (0, 1, 1)
    again = compile_and_check(pointwise, torch.randn(3, 4))
    assert counts() == (1, 1, 1)
    assert again.kiln_source and again.kiln_wrapper and not again.kiln_fallbacks
    assert again.kiln_aten.num_user_outputs == 1  # inspection traces aot again on demand
    entries = list((cache / "graphs").rglob("*.json"))
    assert len(entries) == 1 and entries[0].parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("change", ["graph", "dtype", "stride", "offset", "option"])
def test_a_change_does_not_reuse_the_entry(cache, change):
    x = torch.randn(4, 4)
    compile_and_check(pointwise, x)
    fn, arg, options = pointwise, x, None
    if change == "graph":
        fn = lambda x: (x * 2).cos() + 1  # noqa: E731
    elif change == "dtype":
        arg = x.double()
    elif change == "stride":
        arg = x.t()
    elif change == "offset":
        arg = torch.randn(20)[4:].view(4, 4)
    else:
        options = {"epilogue_fusion": False}
    compile_and_check(fn, arg, options=options)
    assert counts() == (0, 2, 2)


def test_damaged_entry_is_ignored_and_rewritten(cache):
    x = torch.randn(5)
    compile_and_check(pointwise, x)
    [entry] = (cache / "graphs").rglob("*.json")
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0x5A  # one byte flipped: the digest no longer matches
    entry.write_bytes(bytes(data))
    compile_and_check(pointwise, x)
    assert counts() == (0, 2, 2)
    entry.write_bytes(b"")  # truncated
    compile_and_check(pointwise, x)
    assert counts() == (0, 3, 3)
    compile_and_check(pointwise, x)
    assert counts() == (1, 3, 3)


def test_the_key_is_the_graph_compiled_not_code_made_before_an_edit(cache):
    """kiln compiles a graph module's graph (aot runs it node by node), so the key holds its nodes, not
    the code torch.fx generated from them (a graph rebuilt from disk makes none): a graph edited after
    its code was made is keyed as edited, and the graph it was before gets an entry of its own."""
    x = torch.randn(5)
    gm = traced(pointwise)
    [sin] = [n for n in gm.graph.nodes if n.target == "sin"]
    sin.target = "cos"  # no recompile: gm.code still calls sin
    edited = lambda x: (x * 2).cos() + 1  # noqa: E731
    torch.testing.assert_close(compile_fx(gm, [x])(x), edited(x))
    compile_and_check(pointwise, x)  # sin, what gm.code still says: not the edited graph's entry
    assert counts() == (0, 2, 2)


def test_option_switches_the_cache_off(cache):
    x = torch.randn(5)
    for _ in range(2):
        compile_and_check(pointwise, x, options={"graph_cache": False})
    assert counts() == (0, 0, 0) and not (cache / "graphs").exists()


class FunctionalNorm(torch.nn.Module):
    """BatchNorm in training mode written with get_attr reads (what symbolic_trace keeps of it): its
    running stats are module buffers the graph updates."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.b = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x):
        y = torch.nn.functional.batch_norm(x, self.mean, self.var, self.w, self.b, training=True)
        return y * self.w


def test_loaded_graph_reads_current_module_tensors(cache):
    """The loaded graph takes parameters and buffers from the module it is given, as they are now,
    and writes mutated buffers back."""
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    with torch.no_grad():
        for round_ in range(2):
            net = FunctionalNorm()
            eager = copy.deepcopy(net)
            compiled = compile_fx(torch.fx.symbolic_trace(net), [x])
            for _ in range(2):
                torch.testing.assert_close(compiled(x), eager(x))
                torch.testing.assert_close(dict(net.named_buffers()), dict(eager.named_buffers()))
                for m in (net, eager):
                    m.w.mul_(-2)  # in place, between calls
    assert counts() == (1, 1, 1)


def test_submodule_calls_are_compiled_but_not_cached(cache):
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    net = Net().eval()
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compile_fx(torch.fx.symbolic_trace(net), [x])(x), net(x))
    assert counts() == (0, 0, 0) and graph_cache.stats.uncacheable == 2


# ---- capture makes a ShapeEnv only when a size is symbolic ------------------------------------------
@pytest.mark.parametrize("program, dynamic, expect_env", [
    ("static", False, False), ("dynamic", True, True), ("data_dependent", False, True)])
def test_capture_makes_a_shape_env_only_when_needed(monkeypatch, program, dynamic, expect_env):
    import kiln
    from kiln.capture import graph_builder
    made = []

    class CountingShapeEnv(graph_builder.ShapeEnv):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(graph_builder, "ShapeEnv", CountingShapeEnv)
    fn = {"static": lambda x: (x * 2).sin() + 1,
          "dynamic": lambda x: x.sum(0) * 2,
          "data_dependent": lambda x: torch.nonzero(x).float().sum() + x.sum()}[program]
    x = torch.tensor([[0.0, 1.5], [-2.0, 0.0]])
    compiled = kiln.compile(fn, backend="eager", dynamic=dynamic)
    torch.testing.assert_close(compiled(x), fn(x))
    assert bool(made) == expect_env


if __name__ == "__main__":
    _child(int(sys.argv[1]))


def test_an_output_viewing_another_keeps_the_link_after_a_load(cache):
    def views_of_one_result(x):
        t = x * 2
        return t, t[:, 1:]
    for expect in ((0, 1, 1), (1, 1, 1)):  # compiled and stored, then loaded from the cache
        compiled = compile_and_check(views_of_one_result, torch.randn(3, 4))
        assert counts() == expect
        whole, part = compiled(torch.randn(3, 4))
        assert _same_storage(whole, part)
        whole.add_(1)  # in eager the view sees the write
        torch.testing.assert_close(part, whole[:, 1:])


def experts(idx, gates, s0, s1, s2, s3, x, w1, w2, length):
    """A mixture-of-experts step as Hugging Face JetMoE writes it: tokens split by expert sizes."""
    pieces = x[idx].split([s0, s1, s2, s3], dim=0)
    h = torch.cat([torch.nn.functional.linear(p, w1[i]) for i, p in enumerate(pieces)], 0)
    a, b = h.chunk(2, dim=-1)
    pieces = (torch.nn.functional.silu(a) * b).split([s0, s1, s2, s3], 0)
    o = torch.cat([torch.nn.functional.linear(p, w2[i]) for i, p in enumerate(pieces)], 0) * gates[:, None]
    return torch.zeros(2 * length, 16).index_add(0, idx, o)


def test_code_a_compile_specialized_is_not_loaded_for_sizes_it_does_not_fit():
    """The compile of a graph with symbolic sizes may prove more (an expert's size is 0 or 1) and
    specialize its code; the same graph captured again without that fact (the guard failed) must
    not load that code from the graph cache."""
    import kiln
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(4, 64, 16, generator=g), torch.randn(4, 16, 32, generator=g)
    compiled = kiln.compile(experts)
    for length, sizes in ((4, [2, 2, 2, 10]), (6, [0, 3, 1, 20]), (9, [4, 18, 7, 7])):
        n = 2 * length
        idx = torch.cat([torch.randperm(n, generator=g), torch.randperm(n, generator=g)])
        args = (idx, torch.rand(2 * n, generator=g), *sizes, torch.randn(n, 16, generator=g), w1, w2, length)
        torch.testing.assert_close(compiled(*args), experts(*args))


def test_training_code_a_compile_specialized_is_not_loaded_for_sizes_it_does_not_fit():
    """The same for the training graph cache: the forward/backward pair compiled when a split size
    was 1 was loaded for the next sizes (an out-of-bounds view in the backward's wrapper)."""
    import kiln
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(4, 64, 16, generator=g, requires_grad=True)
    w2 = torch.randn(4, 16, 32, generator=g, requires_grad=True)
    compiled = kiln.compile(experts)
    n = 12
    for sizes in ([3, 4, 5, 12], [1, 11, 8, 4], [9, 6, 7, 2]):
        idx = torch.cat([torch.randperm(n, generator=g), torch.randperm(n, generator=g)])
        x = torch.randn(n, 16, generator=g, requires_grad=True)
        args = (idx, torch.rand(2 * n, generator=g), *sizes, x, w1, w2, n // 2)
        results = []
        for fn in (compiled, experts):
            out = fn(*args)
            out.square().sum().backward()
            results.append([out, *(t.grad for t in (x, w1, w2))])
            for t in (x, w1, w2):
                t.grad = None
        torch.testing.assert_close(results[0], results[1], rtol=1e-3, atol=1e-3)


def test_a_constant_loads_as_itself_under_a_user_backends_tracing_context(cache):
    """A user backend runs in a TracingContext with capture's fake mode (as torch.compile runs it),
    and one that wraps kiln's compile_fx loads graphs from the cache there: a baked constant must
    load as a real tensor, not as the fake (meta) tensor torch.load makes when it finds a fake mode
    (a kernel then read it through a null pointer: a crash on the second process's first call)."""
    import kiln

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs)

    def first(x):
        return baked_constant(x)

    def second(x):  # (another frame with the same graph)
        return baked_constant(x)

    for fn, expected in ((first, (0, 1, 1)), (second, (1, 1, 1))):  # a store, then a load
        compiled = kiln.compile(fn, backend=backend)
        x = torch.randn(2, 3)
        torch.testing.assert_close(compiled(x), baked_constant(x))
        assert counts() == expected
