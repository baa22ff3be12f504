"""The device seam and the Triton kernel backend.

The seam (no Triton needed): a buffer's device picks its kernel backend; the C++ backend never
sees another device's memory (proven with fake CUDA tensors, which need no GPU), and a device with
no backend runs through aten. The Triton backend runs here under Triton's interpreter
(TRITON_INTERPRET=1), on CPU tensors sent to it with device_backend={"cpu": "triton"}; eager is
the oracle, and each test checks the graph really ran as Triton kernels (no whole-graph fallback).
"""
import contextlib
import json
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln
from kiln.compiler import aot, compile_fx
from kiln.compiler.codegen import backend as backend_mod
from kiln.compiler.codegen import cpp
from kiln.compiler.codegen.triton_libm import interpreting
from kiln.compiler.lower import GraphLowering
from kiln.compiler.memory_plan import plan_memory
from kiln.compiler.schedule import Kernel, build_program
from kiln.config import compiler_options

TRITON = {"device_backend": {"cpu": "triton"}, "graph_cache": False}


def lower_fake(fn, inputs, options):
    """The scheduled program of `fn` over fake inputs (fake CUDA tensors need no GPU)."""
    gm = torch.fx.symbolic_trace(fn)
    aten = aot.trace_aten(gm, inputs)
    graph = GraphLowering(aten.gm, inputs, options).run()
    return graph, build_program(graph, options, graph.backends.can_fuse)


def mixed_inputs():
    with FakeTensorMode():
        return [torch.empty(4, 8, device="cuda"), torch.empty(4, 8)]


def mixed_fn(x, y):
    return (x * 2).softmax(-1), (y + 1).sin().sum(0)


# ---- the seam ------------------------------------------------------------------------------------

def test_cuda_ops_run_through_aten_when_cuda_has_no_backend():
    options = compiler_options(options={"device_backend": {"cuda": "cpp"}})  # cpp cannot reach cuda memory
    graph, program = lower_fake(mixed_fn, mixed_inputs(), options)
    kernels = [s for s in program.steps if isinstance(s, Kernel)]
    assert kernels and all(n.layout.device.type == "cpu" for k in kernels for n in k.nodes)
    assert any("softmax" in f or "mul" in f for f in graph.fallbacks), graph.fallbacks
    source, _ = cpp.generate(program, plan_memory(program), options)
    assert "arg0" not in source  # the CUDA input is no argument of any C++ entry


def test_cuda_kernels_go_to_their_own_backend_never_to_cpp(monkeypatch):
    # pretend Triton reaches CUDA here: the CUDA part becomes kernels on cuda buffers, fused apart
    # from the CPU part, and handed to the Triton backend alone
    from kiln.compiler.codegen.triton_backend import TritonBackend
    monkeypatch.setattr(TritonBackend, "reaches", lambda self, device: device.type == "cuda")
    options = compiler_options()
    graph, program = lower_fake(mixed_fn, mixed_inputs(), options)
    assert not graph.fallbacks
    groups = graph.backends.by_backend(program)
    devices = {b.name: {n.layout.device.type for k in kernels for n in k.nodes} for b, kernels in groups}
    assert devices == {"triton": {"cuda"}, "cpp": {"cpu"}}
    cuda_kernel = next(k for b, ks in groups if b.name == "triton" for k in ks)
    with pytest.raises(AssertionError, match="device cuda"):  # the C++ writer's own check, if the seam failed
        cpp.generate(program, plan_memory(program), options, kernels=[cuda_kernel])


def test_a_backend_is_never_used_for_a_device_it_cannot_reach():
    backends = backend_mod.DeviceBackends(compiler_options(options={"device_backend": {"meta": "cpp"}}))
    assert backends.for_device(torch.device("meta")) is None
    assert backends.for_device(torch.device("cpu")).name == "cpp"


def test_meta_graph_mapped_to_cpp_still_runs_through_aten():
    x = torch.empty(4, 5, device="meta")
    compiled = compile_fx(torch.fx.symbolic_trace(lambda x: (x * 2).exp().sum(-1)), [x],
                          compiler_options(options={"device_backend": {"meta": "cpp"}, "graph_cache": False}))
    out = compiled(x)
    assert out.device.type == "meta" and out.shape == (4,)
    assert not compiled.kiln_kernels


def test_unknown_backend_name_is_refused_where_given():
    with pytest.raises(kiln.InvalidArgument, match="device_backend"):
        kiln.compile(lambda x: x, options={"device_backend": {"cpu": "opencl"}})


# ---- Triton kernels under the interpreter ------------------------------------------------------

@pytest.fixture
def interpreter():
    pytest.importorskip("triton")
    if not interpreting():  # set by conftest before triton loads, when there is no GPU
        pytest.skip("CPU tensors reach Triton kernels only under its interpreter (TRITON_INTERPRET=1)")


@contextlib.contextmanager
def no_whole_graph_fallback():
    """Fails if a graph compiled inside runs through aten as a whole (a kernel Triton could not emit)."""
    import kiln.compiler as compiler
    original = compiler._run_through_aten

    def refuse(gm):
        raise AssertionError("the graph ran through aten, not Triton kernels")
    compiler._run_through_aten = refuse
    try:
        yield
    finally:
        compiler._run_through_aten = original


def run_triton(fn, *args, dynamic=False, atol=None, rtol=None):
    """Compile `fn` with its CPU graphs sent to Triton; check against eager and that kernels ran."""
    kiln.reset()
    expected = fn(*[a.clone() for a in args])
    compiled = kiln.compile(fn, options=TRITON, dynamic=dynamic, fullgraph=True)
    with no_whole_graph_fallback():
        got = compiled(*args)
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True)
    return got


def triton_source(fn, *args):
    gm = torch.fx.symbolic_trace(fn)
    compiled = compile_fx(gm, list(args), compiler_options(options=TRITON))
    assert "@triton.jit" in compiled.kiln_source and "<whole graph>" not in compiled.kiln_fallbacks
    return compiled


@pytest.mark.parametrize("fn", [
    lambda x: (x * 2).sin() + x.t().cos(),
    # masked-off lanes read 0: lgamma's pole there must not fail the kernel
    lambda x: torch.where(x > 0, x.exp(), torch.tanh(x)) - torch.log1p(x.abs()) + torch.lgamma(x.abs()),
    lambda x: torch.nn.functional.gelu(x) * torch.sigmoid(x[:, :1]),
], ids=["chain_with_transpose", "where_exp_tanh", "gelu_broadcast"])
def test_pointwise(interpreter, fn):
    x = torch.randn(37, 37)
    triton_source(fn, x)
    run_triton(fn, x)


@pytest.mark.parametrize("cols", [70, 3000], ids=["persistent", "looped"])
def test_softmax_and_layer_norm(interpreter, cols):
    x = torch.randn(6, cols)
    w, b = torch.randn(cols), torch.randn(cols)
    fn = lambda x, w, b: (torch.softmax(x, -1), torch.nn.functional.layer_norm(x, (cols,), w, b))  # noqa: E731
    triton_source(fn, x, w, b)
    run_triton(fn, x, w, b)


def test_reductions_keep_eager_nan_and_dtype_rules(interpreter):
    x = torch.randn(9, 50)
    x[2, 7] = float("nan")
    fn = lambda x: (x.amax(-1), x.amin(0), x.sum(-1, dtype=torch.float64), (x > 0).any(-1),  # noqa: E731
                    (x > -3).all(0), x.prod(-1), x.to(torch.int64).sum(0))
    run_triton(fn, x)


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_arg_reductions_pick_the_first_and_nan_as_eager(interpreter, looped, monkeypatch):
    from kiln.compiler.codegen import triton_kernels
    if looped:  # small blocks: the interpreter's reduce with a combine function is slow on wide ones
        monkeypatch.setattr(triton_kernels, "PERSISTENT_RBLOCK", 16)
        monkeypatch.setattr(triton_kernels, "LOOPED_RBLOCK", 16)
    x = torch.randint(-3, 3, (7, 50)).float()  # many ties
    x[2, 5] = x[2, 40] = float("nan")
    x[4] = float("-inf")
    fn = lambda x: (x.argmax(-1), x.argmin(-1), x.max(0), x.to(torch.int64).argmax(0))  # noqa: E731
    run_triton(fn, x)


def test_max_pool_indices(interpreter):
    x = torch.randn(2, 3, 9, 9)
    x[0, 1, 2, 2] = float("nan")
    x[1, 0, :4, :4] = float("-inf")
    fn = lambda x: torch.nn.functional.max_pool2d(x, 3, 2, padding=1, return_indices=True)  # noqa: E731
    run_triton(fn, x)


def test_whole_tensor_sum_loops_over_blocks(interpreter):
    run_triton(lambda x: (x.sum(), x.abs().max()), torch.randn(20000), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_compute_in_float32_and_round_as_eager(interpreter, dtype):
    x = torch.randn(8, 100).to(dtype)
    run_triton(lambda x: ((x * 3 + 1).softmax(-1), x.sum(-1), (x * 1.7).exp()), x)


def test_integer_division_and_remainder_floor_like_eager(interpreter):
    a = torch.arange(-20, 20).repeat(3)
    b = torch.tensor([-3, 3, 7]).repeat_interleave(40)
    run_triton(lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")), a, b)


def test_negation_keeps_the_sign_of_zero(interpreter):
    x = torch.tensor([0.0, -0.0, 1.5, -2.0, float("inf"), float("nan")])
    got = run_triton(lambda x: (-x, torch.neg(x * 2), -x.double()), x)
    real = ~x.isnan()  # (a NaN's sign bit means nothing)
    for g in (got[0], got[2]):
        assert torch.equal(g[real].signbit(), (-x)[real].signbit())


def test_integer_powers_by_squaring_wrap_as_eager(interpreter):
    a = torch.arange(-6, 7)
    fn = lambda a: (a ** 0, a ** 1, a ** 3, (a + 2) ** 7, a.to(torch.int32) ** 5, a.to(torch.uint8) ** 3,  # noqa: E731
                    (a * 1000) ** 9)
    run_triton(fn, a)


def test_symbolic_sizes_are_kernel_arguments(interpreter):
    fn = lambda x: torch.softmax(x * 2, -1).sum(0)  # noqa: E731
    kiln.reset()
    compiled = kiln.compile(fn, options=TRITON, dynamic=True)
    for rows, cols in ((3, 40), (5, 77), (2, 1500)):
        x = torch.randn(rows, cols)
        with no_whole_graph_fallback():
            torch.testing.assert_close(compiled(x), fn(x))


def test_floats_computed_from_sizes_are_doubles_in_kernels(interpreter):
    # 1.0 / x.size(1) is a Python float (a double, as eager's) computed by the wrapper; a kernel takes
    # it as float64 (Triton types a bare Python float as float32)
    def fn(x):
        return x * (1.0 / x.size(1)), x.mean(-1) + x.size(0) / 3
    kiln.reset()
    compiled = kiln.compile(fn, options=TRITON, dynamic=True)
    for cols in (7, 11):
        x = torch.randn(5, cols, dtype=torch.float64)
        with no_whole_graph_fallback():
            got = compiled(x)
        expected = fn(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)  # one rounding, of the double


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_variance_and_norms_read_a_long_row_once(interpreter, dtype):
    # rows past one block: mean and variance in one loop over the row (Welford's update, lanes
    # combined at the end), then one loop to normalize; far from 0 the naive sum of squares would
    # cancel; short rows (in registers), a correction and odd lengths too
    long, short = (torch.randn(2, 1100) * 3 + 1000).to(dtype), torch.randn(3, 77).to(dtype)
    norm = torch.nn.LayerNorm(1100, dtype=dtype)

    def fn(long, short):
        return (norm(long), torch.var_mean(long, -1, correction=0), long.std(-1), torch.var(short, -1),
                torch.nn.functional.layer_norm(short, (77,)))
    # (float32 at 1000 +- 3: eager's own error against float64 is 1.4e-5, and C++ kiln's 5e-5)
    tolerance = {torch.bfloat16: dict(atol=5e-2, rtol=5e-2), torch.float32: dict(atol=1e-4, rtol=1e-4)}.get(dtype, {})
    run_triton(fn, long, short, **tolerance)
    source = triton_source(lambda x: torch.nn.functional.layer_norm(x, (1100,)), long).kiln_source
    assert "kiln_welford_combine" in source and source.count("for roffset") == 2


def test_float64_square_roots(interpreter):
    # Triton's correctly rounded sqrt_rn is float32's only: float64 takes sqrt (exact on GPUs too)
    x = torch.rand(64, dtype=torch.float64) + 0.5
    run_triton(lambda x: (x.sqrt(), x.rsqrt() * 3, 1 / x), x)


def test_reductions_over_empty_rows_read_no_memory(interpreter):
    # a row of no elements reads nothing, not even a value it would broadcast over the row (the
    # interpreter loads real addresses: reading past an empty buffer crashed it)
    e, x = torch.empty(4, 0), torch.randn(4, 3)
    fn = lambda e, x: ((e * 2).sum(), e.sum(1), e.prod(1), (e > 0).any(1),  # noqa: E731
                       torch.cumsum(e.reshape(0), 0).sum(), x + e.sum(1, keepdim=True))
    run_triton(fn, e, x)


def test_scans_walk_in_order_as_eager(interpreter):
    x = torch.randn(5, 9, 4)
    x[1, 3, 2] = float("nan")
    fn = lambda x: ((x + 1).cumsum(1), x.cumprod(-1), x.cummax(1), x.cummin(0),  # noqa: E731
                    torch.logcumsumexp(x, 2), x.to(torch.bfloat16).cumsum(1))
    run_triton(fn, x)


def test_scatters_write_in_eager_order_and_check_positions(interpreter):
    x, i = torch.randn(5, 9), torch.tensor([[0, 2, 2, 1]])
    fn = lambda x, i: ((x + 1).scatter_add(1, i.expand(5, 4), x[:, :4]),  # noqa: E731
                       x.scatter(1, i.expand(5, 4), x[:, 4:8] * 2),
                       x.scatter_reduce(1, i.expand(5, 4), x[:, :4], "amax", include_self=False),
                       x.index_put((torch.tensor([4, 0, 4]),), x[:3] * 3, accumulate=True),
                       torch.slice_scatter(x, x[:, :3] * 2, 1, 2, 8, 2))
    run_triton(fn, x, i)
    with pytest.raises(RuntimeError, match="out of bounds"):
        kiln.compile(lambda x, i: x.scatter_add(1, i, x[:, :2]), options=TRITON)(x, torch.tensor([[0, 9]] * 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_float_floor_division_and_remainder_as_eager(interpreter, dtype):
    # signed zeros, a zero divisor (inf, NaN), infinities, quotients that round near an integer
    a = torch.tensor([7.5, -7.5, 7.5, -7.5, 0.0, -0.0, 1.0, -1.0, 0.0, float("inf"), 3.0, 1e30, -1e-30,
                      0.3, -0.3, 5.0, float("nan"), 2.0])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 0.0, 0.0, 2.0, float("inf"), 3.0, 7.0,
                      0.1, 0.1, -float("inf"), 1.0, -0.0])
    a, b = a.to(dtype).repeat(3), b.to(dtype).repeat(3)
    fn = lambda a, b: (a // b, a % b, torch.remainder(a * 3, 0.7), (a + 1) // 0.7, 2.5 // b,  # noqa: E731
                       torch.fmod(torch.tensor(5.0, dtype=a.dtype), b))
    got = run_triton(fn, a, b)
    expected = fn(a, b)
    for g, e in zip(got, expected):  # the signs of zeros too
        assert torch.equal(torch.signbit(g[g == 0]), torch.signbit(e[e == 0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_scatters_round_each_step_as_eager(interpreter, dtype):
    # many adds into one element: each sum rounded to the half dtype, in eager's order
    x, i = torch.randn(4, 6).to(dtype), torch.tensor([[0, 2, 2, 2, 2, 1, 2, 2]])
    src = (torch.randn(4, 8) * 100).to(dtype)
    fn = lambda x, i, s: (x.scatter_add(1, i.expand(4, 8), s), x.scatter(1, i[:, :3].expand(4, 3), s[:, :3] / 3),  # noqa: E731
                          x.scatter_reduce(1, i.expand(4, 8), s, "amax", include_self=False),
                          x.index_put((torch.tensor([3, 0, 3]),), s[:3, :6], accumulate=True))
    run_triton(fn, x, i, src, atol=0, rtol=0)


def test_what_triton_cannot_emit_runs_through_aten(interpreter, monkeypatch):
    # an op the Triton printer refuses sends its graph through aten, with eager's answer
    from kiln.compiler.codegen import triton_exprs
    monkeypatch.delitem(triton_exprs.CORE_UNARY, "sin")
    x = torch.randn(5, 9)
    fn = lambda x: (x * 3).sin()  # noqa: E731
    compiled = compile_fx(torch.fx.symbolic_trace(fn), [x], compiler_options(options=TRITON))
    torch.testing.assert_close(compiled(x), fn(x))
    assert "<whole graph>" in compiled.kiln_fallbacks


def test_mutated_input_and_extern_between_kernels(interpreter):
    def fn(x, w):
        x.mul_(2)
        return torch.relu(x @ w + 1).sum(-1)
    x, w = torch.randn(6, 8), torch.randn(8, 5)
    x_eager = x.clone()
    expected = fn(x_eager, w)
    kiln.reset()
    with no_whole_graph_fallback():
        got = kiln.compile(fn, options=TRITON)(x, w)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, x_eager)


def test_indirect_indexing_gathers_and_checks_its_indices(interpreter):
    table, x = torch.randn(10, 6), torch.randn(4, 10)
    idx = torch.tensor([[1, 9, -1], [0, 3, 3]])
    fn = lambda t, x, i: (torch.nn.functional.embedding(i.clamp(min=0), t) * 2,  # noqa: E731
                          torch.gather(x, 1, i.abs().repeat(2, 1)), t[i] + 1)
    run_triton(fn, table, x, idx)
    with pytest.raises(IndexError, match="out of bounds"):
        kiln.compile(lambda t, i: t[i] * 2, options=TRITON)(table, torch.tensor([2, 10]))


def test_device_backend_from_the_environment(monkeypatch):
    monkeypatch.setenv("KILN_DEVICE_BACKEND", "cpu:triton, cuda:triton")
    assert dict(compiler_options()["device_backend"]) == {"cpu": "triton", "cuda": "triton"}
    assert dict(compiler_options(options={"device_backend": {"cpu": "cpp"}})["device_backend"]) == {"cpu": "cpp"}
    for wrong in ("cpu", "cpu:opencl"):
        monkeypatch.setenv("KILN_DEVICE_BACKEND", wrong)
        with pytest.raises(kiln.InvalidArgument):
            compiler_options()


# ---- max_autotune: block configs benchmarked, the fastest kept on disk ------------------------

def test_autotune_candidates_keep_what_the_kernel_source_assumes():
    from kiln.compiler.codegen.triton_autotune import Config, candidates
    persistent = candidates(Config(4, 256, 4), "persistent")
    assert persistent[0] == Config(4, 256, 4) and len(persistent) > 3
    assert {c.rblock for c in persistent} == {256}  # a persistent row is one block
    looped = candidates(Config(8, 512, 8), "looped")
    assert len({c.rblock for c in looped}) > 2 and all(c.xblock * c.rblock <= 8192 for c in looped)
    small = candidates(Config(8, 1, 1), "pointwise", numel=5)
    assert all(c.xblock <= 8 for c in small[1:]) and all(c.num_warps * 32 <= max(32, c.xblock) for c in small[1:])


class FakeTimer:
    """Times a config by a made-up cost (the fewest elements per block wins), running the first
    launch it times (one that broke its arguments would show; the interpreter is too slow for
    all); counts what it timed."""

    def __init__(self):
        self.timed = []

    def __call__(self, launch, config):
        if not self.timed:
            launch()
        self.timed.append(config)
        return config.xblock * config.rblock + config.num_warps / 16


def test_max_autotune_picks_the_fastest_config_and_keeps_it_on_disk(interpreter, monkeypatch, tmp_path):
    from kiln.compiler.codegen import triton_autotune
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    timer = FakeTimer()
    monkeypatch.setattr(triton_autotune, "timer", timer)
    for name, values in (("LOOPED_RBLOCKS", (64, 1024)), ("POINTWISE_XBLOCKS", (128,)), ("WARPS", (4,))):
        monkeypatch.setattr(triton_autotune, name, values)  # few candidates: the interpreter is slow

    def fn(x, y):
        y.add_(1)  # a mutated input: benchmarks run on copies, so it is added to once
        return (x * 2).softmax(-1), x.sum(-1), (x + y).cos()
    x, y = torch.randn(2, 1100), torch.randn(2, 1100)  # rows longer than one block: a looped reduction
    options = dict(TRITON, max_autotune=True)

    def run():
        kiln.reset()
        y_eager, y_kiln = y.clone(), y.clone()
        expected = fn(x, y_eager)
        with no_whole_graph_fallback():
            got = kiln.compile(fn, options=options)(x, y_kiln)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(y_kiln, y_eager)
    run()
    assert {c.rblock for c in timer.timed} >= {64, 512, 1024}  # the heuristic's and the candidates' RBLOCKs
    files = list((tmp_path / "autotune").iterdir())
    chosen = {triton_autotune.Config(**json.loads(f.read_text())["config"]) for f in files}
    assert triton_autotune.Config(2, 64, 4) in chosen  # the looped rows' cheapest (by the fake's costs)
    timer.timed.clear()
    run()  # a new compile finds every choice on disk
    assert timer.timed == []
    for f in files:
        f.write_text("{damaged")
    run()  # a damaged entry is benchmarked again, never trusted
    assert timer.timed


# ---- coordinate_descent_tuning: one knob at a time from the heuristic's config ------------------

def valley(xblock, num_warps, rblock=None):
    """A made-up cost whose fastest config is (xblock, rblock, num_warps): distance in powers of 2."""
    def cost(config):
        far = abs(math.log2(config.xblock / xblock)) + abs(math.log2(config.num_warps / num_warps))
        return far + (abs(math.log2(config.rblock / rblock)) if rblock else 0)
    return cost


def one_knob_apart(a, b):
    changed = [(getattr(a, k), getattr(b, k)) for k in ("xblock", "rblock", "num_warps") if getattr(a, k) != getattr(b, k)]
    return len(changed) == 1 and max(changed[0]) == 2 * min(changed[0])


def test_coordinate_descent_moves_one_knob_at_a_time_to_the_fastest():
    from kiln.compiler.codegen.triton_autotune import Config, coordinate_descent, legal
    default, timed = Config(1024, 1, 8), []

    def time_of(cost):
        return lambda config: timed.append(config) or cost(config)
    best = coordinate_descent(default, default, "pointwise", 1 << 20, time_of(valley(64, 2)))
    assert best == Config(64, 1, 2)  # below every xblock of max_autotune's list: only the descent gets there
    assert len(timed) == len(set(timed)) and timed[0] == default  # each config timed once
    assert all(any(one_knob_apart(c, seen) for seen in timed[:i]) for i, c in enumerate(timed) if i)
    assert all(legal(c, default, "pointwise", 1 << 20) for c in timed)
    # a persistent row keeps its RBLOCK (the kernel reads the row in one block); a looped one moves it
    persistent = Config(4, 256, 4)
    assert coordinate_descent(persistent, persistent, "persistent", 64, valley(8, 4, rblock=64)) == Config(8, 256, 4)
    looped = Config(2, 512, 4)
    assert coordinate_descent(looped, looped, "looped", 2, valley(8, 4, rblock=64)) == Config(2, 64, 4)
    # a move within noise is not taken
    near = lambda config: 1.0 - 0.001 * (config != default)  # noqa: E731
    assert coordinate_descent(default, default, "pointwise", 1 << 20, near) == default


def test_coordinate_descent_tuning_tunes_triton_launches_and_keeps_them_on_disk(interpreter, monkeypatch, tmp_path):
    from kiln.compiler.codegen import triton_autotune
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    cost, timed = valley(64, 2, rblock=128), []

    def timer(launch, config):
        if not timed:
            launch()  # one real launch (the interpreter is too slow for all)
        timed.append(config)
        return cost(config)
    monkeypatch.setattr(triton_autotune, "timer", timer)

    def fn(x, y):
        return (x * 2).cos() + 1, y.sum(-1)
    x, y = torch.randn(4096), torch.randn(2, 1100)  # a pointwise launch and a looped reduction

    def run(**tuning):
        kiln.reset()
        with no_whole_graph_fallback():
            got = kiln.compile(fn, options=dict(TRITON, **tuning))(x, y)
        torch.testing.assert_close(got, fn(x, y))
        files = list((tmp_path / "autotune").iterdir())
        return files, {triton_autotune.Config(**json.loads(f.read_text())["config"]) for f in files}
    files, chosen = run(coordinate_descent_tuning=True)
    assert chosen == {triton_autotune.Config(64, 1, 2),   # pointwise: 1024 elements a block and 8 warps before
                      triton_autotune.Config(2, 128, 2)}  # looped rows: xblock stays 2 (two rows), RBLOCK 512 -> 128
    assert len(timed) == len(set(timed)) < 30  # each config once; far fewer than every combination
    timed.clear()
    run(coordinate_descent_tuning=True)  # a new compile finds both choices on disk
    assert timed == []
    files, chosen_both = run(coordinate_descent_tuning=True, max_autotune=True)  # both: descent from the best candidate
    assert len(files) == 4 and chosen_both == chosen  # kept apart from the descent's own choices
    assert set(triton_autotune.candidates(triton_autotune.Config(1024, 1, 8), "pointwise", 4096)) <= set(timed)


# ---- the kernels compile for a GPU (no GPU needed: Triton compiles to a cubin offline) -----------

NOT_FOR_A_GPU = '''import triton
import triton.language as tl


@triton.jit
def kernel(out, n):
    tl.store(out + tl.arange(0, n), 1.0)  # a block size that is no constexpr: the interpreter runs it
'''


def test_kernels_compile_for_a_gpu_target(interpreter, monkeypatch, tmp_path):
    from triton.runtime import interpreter as triton_interpreter
    from tests.compiler import triton_gpu_compile
    records = []
    launch = triton_interpreter.GridExecutor.__call__
    monkeypatch.setattr(triton_interpreter.GridExecutor, "__call__", triton_gpu_compile.recorder(launch, records))

    def fn(x):  # a reduction, a float from sizes (a float64 argument), libdevice's tanh
        return x.softmax(-1), x * (1.0 / x.size(0)), x.tanh()
    run_triton(fn, torch.randn(3, 40, dtype=torch.float64), dynamic=True)
    assert records  # (one fused kernel)
    broken = tmp_path / "not_for_a_gpu.py"
    broken.write_text(NOT_FOR_A_GPU)
    records.append({"path": str(broken), "name": "kernel", "args": [["tensor", "float32", True], ["int", 8]],
                    "constexprs": {}, "num_warps": 4})
    status, output = triton_gpu_compile.compile_in_a_fresh_process(records)
    assert f"{len(records)} launches, {len(records) - 1} compiled, 1 failed" in output, output
    assert "not_for_a_gpu.py::kernel" in output and status == 1
