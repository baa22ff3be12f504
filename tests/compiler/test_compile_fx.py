"""kiln's compiler end to end: fx graph -> C++ kernels, checked against eager."""
import pytest
import torch
import torch.nn.functional as F

from kiln.compiler import compile_fx, lowerings
from kiln.config import compiler_options


def compiled(fn, *args, **options):
    gm = torch.fx.symbolic_trace(fn)
    return compile_fx(gm, list(args), compiler_options(options=options or None))


def check(fn, *args, rtol=1e-5, atol=1e-5, **options):
    """Compile fn for args, compare with eager, return the compiled callable."""
    c = compiled(fn, *args, **options)
    torch.testing.assert_close(c(*args), fn(*args), rtol=rtol, atol=atol, equal_nan=True)
    return c


def kernels(fn):
    return fn.kiln_kernels


def ten_pointwise(x):
    y = x
    for i in range(5):
        y = torch.sin(y) * 1.5
        y = torch.relu(y - 0.1)
    return y


def test_ten_pointwise_ops_are_one_kernel():
    c = check(ten_pointwise, torch.randn(64, 48))
    assert len(kernels(c)) == 1
    assert not c.kiln_fallbacks


def test_softmax_and_log_softmax_are_at_most_two_kernels():
    x = torch.randn(32, 100)
    assert len(kernels(check(lambda x: torch.softmax(x, -1), x))) <= 2
    assert len(kernels(check(lambda x: torch.log_softmax(x, 0), x))) <= 2


def test_softmax_keeps_exp_in_a_row_array():
    c = check(lambda x: torch.softmax(x, -1), torch.randn(16, 300))
    assert "row_" in c.kiln_source  # exp(x - max) is computed once per element, not twice


def test_layer_norm_is_at_most_two_kernels():
    x, w, b = torch.randn(16, 64), torch.randn(64), torch.randn(64)
    c = check(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b, atol=1e-5, rtol=1e-4)
    assert len(kernels(c)) <= 2
    assert not c.kiln_fallbacks


def test_epilogue_fusion_option_keeps_consumers_out_of_reductions():
    x = torch.randn(32, 100)
    fused = check(lambda x: torch.softmax(x, -1), x)
    apart = check(lambda x: torch.softmax(x, -1), x, epilogue_fusion=False)
    assert len(kernels(apart)) > len(kernels(fused))


def test_layer_norm_gelu_residual_fuses():
    x, w, b = torch.randn(16, 64), torch.randn(64), torch.randn(64)
    c = check(lambda x, w, b: F.gelu(F.layer_norm(x, (64,), w, b)) + x, x, w, b, rtol=1e-4)
    assert len(kernels(c)) <= 2


@pytest.mark.parametrize("op", [
    lambda x: x.sum(), lambda x: x.sum(0), lambda x: x.sum(1, keepdim=True), lambda x: x.mean(-1),
    lambda x: x.var(0), lambda x: x.std(), lambda x: x.amax(1), lambda x: x.amin(0),
    lambda x: x.argmax(1), lambda x: x.argmin(), lambda x: x.max(1), lambda x: x.prod(1),
    lambda x: (x > 1).any(1), lambda x: (x > -3).all(), lambda x: torch.var_mean(x, 1, correction=0),
])
def test_reductions(op):
    check(op, torch.randn(17, 33), rtol=1e-4)


def test_reductions_propagate_nan_as_eager():
    x = torch.randn(4, 8)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    check(lambda x: (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), x.sum(1)), x)
    check(lambda a, b: (torch.maximum(a, b), torch.minimum(a, b)), x, x.flip(0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.uint8, torch.float16,
                                   torch.bfloat16])
def test_dtypes(dtype):
    x = (torch.randn(9, 7) * 10).to(dtype)
    y = (torch.randn(9, 7) * 10).to(dtype)
    check(lambda a, b: (a * 3 + b - a.abs(), (a > b).sum(1), a.to(torch.float32) / 3), x, y)


def test_integer_division_and_remainder_follow_python_rules():
    a = torch.randint(-20, 20, (50,))
    b = torch.randint(1, 7, (50,)) * (torch.randint(0, 2, (50,)) * 2 - 1)
    check(lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc"), a / b), a, b)
    fa, fb = a.float() + 0.5, b.float()
    check(lambda a, b: (a // b, a % b, torch.fmod(a, b)), fa, fb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pow_by_small_constants_is_multiplies_and_matches_eager(dtype):
    # x**3 (GELU-tanh) and friends lower to mul/sqrt/reciprocal instead of a powf call per element
    x = torch.cat([torch.randn(61) * 3, torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"),
                                                      float("nan")])]).to(dtype)
    fn = lambda x: tuple(torch.pow(x, e) for e in (2, 3, 3.0, 0.5, -0.5, -1, -2.0, 1.5))
    check(fn, x, rtol=1e-5 if dtype != torch.bfloat16 else 1e-2)
    cube = compiled(lambda x: x ** 3, torch.randn(8))
    code = [line for line in cube.kiln_source.split("kiln_entry", 1)[1].splitlines() if "//" not in line]
    assert "pow" not in "\n".join(code)  # (the kernel's comment names aten.pow, its origin)


def test_promotion_with_scalars_and_mixed_dtypes():
    i = torch.randint(0, 10, (5, 5), dtype=torch.int32)
    f = torch.randn(5, 5)
    check(lambda i, f: (i * 2.5, i + f, i * 3, i.sigmoid(), (i + f.double()).exp()), i, f.double())


def test_views_are_index_maps():
    x = torch.randn(8, 6, 4)
    c = check(lambda x: (x.permute(2, 0, 1) * 2, x.transpose(0, 1)[1:5:2] + 1, x[:, 2] - x[:, 0],
                         x.reshape(48, 4).t() * x.reshape(4, 48), x.unsqueeze(1).expand(8, 3, 6, 4) + 0), x)
    assert not c.kiln_fallbacks


def test_flip_diagonal_repeat():
    x = torch.randn(4, 5, 6)
    c = check(lambda x: (x.flip(0, 2) + 1, torch.diagonal(x, 1, 1, 2) * 2, x.repeat(2, 1, 3) - 1,
                         x[0].repeat(3, 1, 1)), x)
    assert not c.kiln_fallbacks


def test_cat_pad_embedding_gather_index(monkeypatch):
    # a cat of three parts fuses when the limit allows (by default it goes to aten: see
    # test_a_cat_of_many_parts_is_copied_by_aten_and_read_plainly): its chain of selects is tested here
    monkeypatch.setattr(lowerings, "CAT_FUSE_MAX_PARTS", 16)
    x = torch.randn(6, 5)
    idx = torch.tensor([[0, 4], [3, 3], [1, 0], [2, 2], [4, 1], [0, 0]])
    rows = torch.tensor([5, 0, -1, 2])
    c = check(lambda x, idx, rows: (torch.cat([x, x * 2, x[:, :2]], 1), F.pad(x, (1, 2, 0, 3), value=-1.0),
                                    F.embedding(idx, x), torch.gather(x, 1, idx), x[rows], x[:, rows.abs() % 5],
                                    torch.index_select(x, 0, rows.abs())), x, idx, rows)
    assert not c.kiln_fallbacks


def test_externs_mlp_and_attention():
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(16, 32)
    with torch.no_grad():
        c = check(mlp, x, rtol=1e-4, atol=1e-5)
    assert any("addmm" in f for f in c.kiln_fallbacks)

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    check(attention, q, k, v, rtol=1e-4, atol=1e-5)


def test_extern_result_strides_follow_the_inputs_kiln_passes():
    # kiln hands sdpa contiguous q/k/v (the bias add is fused into their copies) where the traced graph
    # had strided views; aten's flash attention then returns other strides than the trace saw, and the
    # later as_strided view for the mm must not read it with the traced ones
    def fn(qkv, b, w):
        B, S, _ = qkv.shape
        q, k, v = (qkv + b).split(64, -1)
        q, k, v = (t.view(B, S, 2, 32).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v)
        return o.transpose(1, 2).reshape(B * S, 64) @ w
    check(fn, torch.randn(2, 16, 192), torch.randn(192), torch.randn(64, 8), rtol=1e-4, atol=1e-4)


def test_op_without_lowering_falls_back_to_aten():
    x = torch.randn(10, 4)
    c = check(lambda x: torch.cumsum(x, 0) * 2 + torch.sort(x, 1).values, x)
    assert c.kiln_fallbacks


class BatchNormInference(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.rand(3))
        self.register_buffer("var", torch.rand(3) + 0.5)
        self.weight = torch.nn.Parameter(torch.randn(3))
        self.bias = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        return F.batch_norm(x, self.mean, self.var, self.weight, self.bias, training=False)


def test_batch_norm_inference():
    with torch.no_grad():
        c = check(BatchNormInference(), torch.randn(2, 3, 5, 5), rtol=1e-4)
    assert not c.kiln_fallbacks


def test_outputs_keep_eager_strides_and_aliases():
    x = torch.randn(5, 7)
    c = compiled(lambda x: (x.t(), (x + 1).t(), x), x)
    a, b, same = c(x)
    assert a.stride() == x.t().stride() and b.stride() == (x + 1).t().stride()
    assert same is x or same.data_ptr() == x.data_ptr()


def test_big_parallel_kernels_match_eager():
    x = torch.randn(300, 500)
    check(lambda x: (torch.softmax(x, 1), x.sum(0), (x * 2).tanh(), x.sum(), x.amax(), x.var()), x,
          rtol=1e-4, atol=1e-4,
          **{"cpp.min_parallel_work": 1024})


def test_random_ops_run_through_aten_under_fallback_random():
    x = torch.randn(50, 50)
    c = compiled(lambda x: torch.rand_like(x) + F.dropout(x, 0.5, training=True), x, fallback_random=True)
    torch.manual_seed(3)
    got = c(x)
    torch.manual_seed(3)
    want = torch.rand_like(x) + F.dropout(x, 0.5, training=True)
    torch.testing.assert_close(got, want)


def test_input_mutation_is_written_back():
    def f(x):
        x.add_(1)
        return x * 2
    x = torch.randn(4, 4)
    expected_x = x.clone()
    expected = f(expected_x)
    c = compiled(f, x.clone())
    got_x = x.clone()
    torch.testing.assert_close(c(got_x), expected)
    torch.testing.assert_close(got_x, expected_x)


def test_value_used_by_later_loops_of_a_fused_kernel():
    # h is computed in the first loop of the layer-norm kernel and read again by the later loops
    def f(x, pos, w, b):
        h = x + pos
        return F.layer_norm(h, (32,), w, b) * 2, h
    check(f, torch.randn(4, 16, 32), torch.randn(16, 32), torch.randn(32), torch.randn(32), rtol=1e-4)


def test_scratch_buffers_share_the_workspace():
    def f(x):
        a = (x.exp() + 1).sum(1, keepdim=True)   # a small temporary between kernels
        b = torch.softmax(x / a, 0).t().contiguous()
        c = torch.softmax(b * 3, 0).t().contiguous()
        return c + 1
    c = check(f, torch.randn(64, 48), rtol=1e-4)
    assert len(kernels(c)) >= 2


def test_trace_folder_has_every_stage(tmp_path):
    c = compiled(lambda x: torch.softmax(x, -1) + 1, torch.randn(8, 8),
                 **{"trace.enabled": True, "trace.debug_dir": str(tmp_path)})
    (folder,) = tmp_path.iterdir()
    names = {p.name for p in folder.iterdir()}
    assert {"fx_graph.txt", "aten_graph.txt", "ir.txt", "schedule.txt", "kernels.cpp", "wrapper.py"} <= names
    assert (folder / "kernels.cpp").read_text() == c.kiln_source


def test_output_code_log_shows_the_source(caplog):
    from kiln.debug.logs import set_logs
    set_logs("output_code")
    try:
        with caplog.at_level("INFO", logger="kiln.output_code"):
            compiled(lambda x: x * 2 + 1, torch.randn(3))
    finally:
        set_logs("")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert 'extern "C"' in text and "def kiln_graph" in text and ".so" in text


def test_cpp_that_fails_to_build_falls_back_to_aten(monkeypatch):
    from kiln.compiler.build import CompileError
    from kiln.compiler.codegen import cpp
    monkeypatch.setattr(cpp, "PRELUDE", cpp.PRELUDE + "\nthis is not C++;\n")
    c = check(lambda x: x * 3 + 1, torch.randn(5))
    assert c.kiln_fallbacks == ["<whole graph>"] and not kernels(c)
    with pytest.raises(CompileError):
        compiled(lambda x: x * 3 + 1, torch.randn(5), debug=True)


def test_symbolic_sizes_run_through_aten():
    x = torch.tensor([0.0, 1.5, 0.0, 2.0])
    c = check(lambda x: x[x.nonzero().flatten()] * 2, x)
    assert c.kiln_fallbacks == ["<whole graph>"]


def test_a_cat_of_many_parts_is_copied_by_aten_and_read_plainly():
    """A cat fused into its consumer loads from every part for each element (a gather where the cat
    dim is the contiguous one): past lowerings.CAT_FUSE_MAX_PARTS parts, aten copies the parts once
    and the consumer (batch norm + ReLU, as in DenseNet) reads one buffer; two parts stay fused."""
    def block(a, b, c, d, e, mean, var):
        return torch.relu(F.batch_norm(torch.cat([a, b, c, d, e], 1), mean, var, training=False))

    parts = [torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last) for _ in range(5)]
    c = check(block, *parts, torch.randn(40), torch.rand(40) + 0.5)
    assert "aten.cat.default" in str(c.kiln_fallbacks), c.kiln_fallbacks
    assert not any("cat" in k.name for k in kernels(c)), kernels(c)
    two = check(lambda a, b: torch.relu(torch.cat([-b, a], -1)), torch.randn(4, 16), torch.randn(4, 16))
    assert not two.kiln_fallbacks and len(kernels(two)) == 1


def test_a_value_read_by_two_aten_calls_is_computed_once():
    """A cheap value (below the shared-realize cost) that two aten calls read is computed into one
    buffer both read: a linear's backward feeds one gradient to its two matmuls, which computed it
    twice (two kernels, two buffers). Here, and with NaN/inf in the inputs, the results are eager's."""
    def two_matmuls(a, b, w1, w2):
        v = a * b - a
        return torch.mm(v, w1), torch.mm(w2, v)

    a, b = torch.randn(64, 32), torch.randn(64, 32)
    a[3, 5], b[7, 1], a[9, 2] = float("nan"), float("inf"), float("-inf")
    c = check(two_matmuls, a, b, torch.randn(32, 16), torch.randn(8, 64))
    assert len(kernels(c)) == 1, kernels(c)
    assert str(c.kiln_fallbacks).count("aten.mm") == 2, c.kiln_fallbacks


def test_a_kernel_takes_at_most_so_many_buffers():
    """A hundred outputs of one size would fuse into one loop of a hundred stores; gcc's time on a
    loop grows faster than its streams (the backward of x.unbind(1)[k] on 257 columns, 256 zero
    slices in one loop, took gcc -O3 over 8 minutes; found by tests/compiler/test_fuzz_training.py),
    so a kernel takes at most schedule.MAX_KERNEL_NODES buffers."""
    from kiln.compiler.schedule import MAX_KERNEL_NODES

    def many(x):
        return tuple(x * i for i in range(2 * MAX_KERNEL_NODES + 3))
    c = check(many, torch.randn(7))
    sizes = [len(k.buffers) for k in kernels(c)]
    assert sum(sizes) == 2 * MAX_KERNEL_NODES + 3 and max(sizes) <= MAX_KERNEL_NODES, sizes
