"""Kernels over symbolic sizes: one compile serves every size, and its generated kernels run.

Each test compiles a function with dynamic shapes (kiln.compile(dynamic=True), or mark_dynamic),
runs it at many sizes against eager (results and inputs after the call), and checks that exactly
one graph was compiled and that it ran as generated C++ kernels taking sizes as arguments, not
through aten."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.backends.registry import lookup_backend
from tests.utils import CompileCounter, assert_equal_state

WHOLE_GRAPH = "<whole graph>"


class Recorder(CompileCounter):
    """Counts graphs, compiles each with kiln's "inductor" and keeps what it returned. It is marked
    as one of kiln's own backends, so it gets the graph `backend="inductor"` gets (sizes read from the
    tensors, not lifted into inputs of their own as for a user backend: test_user_backends.py)."""
    kiln_own = True

    def __init__(self):
        super().__init__()
        self.inner = lookup_backend("inductor")
        self.compiled = []

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        self.compiled.append(self.inner(gm, example_inputs))
        return self.compiled[-1]


def check_sizes(fn, make_args, sizes, dynamic=True, mark=None, rtol=1e-5, atol=1e-5):
    """fn compiled once, equal to eager at every size; returns the compiled graph callable.
    make_args(size) must return equal arguments each time it is called (seeded)."""
    recorder = Recorder()
    compiled = kiln.compile(fn, backend=recorder, dynamic=dynamic)
    for size in sizes:
        # two calls of make_args (seeded): equal values, and the layouts it made (clones would be contiguous)
        eager_args, compiled_args = make_args(size), make_args(size)
        for position, dims in (mark or {}).items():
            kiln.mark_dynamic(compiled_args[position], dims)
        assert_equal_state(compiled(*compiled_args), fn(*eager_args), rtol, atol)
        assert_equal_state(compiled_args, eager_args, rtol, atol)  # inputs after the call
    assert recorder.frame_count == 1, f"{recorder.frame_count} compiles for sizes {sizes}"
    graph = recorder.compiled[0]
    assert graph.kiln_kernels, "no generated kernel"
    assert WHOLE_GRAPH not in graph.kiln_fallbacks, "the graph ran through aten"
    assert "const int64_t s" in graph.kiln_source, "no kernel takes a size argument"
    return graph


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


SIZES = (3, 7, 2, 16, 33)


def test_pointwise_chain_with_broadcasting():
    def fn(x, y, z):
        return (x * y.sin() + 1).relu() - z * 0.5
    graph = check_sizes(fn, lambda n: (randn(n, n + 3), randn(n + 3, seed=1), randn(n, 1, seed=2)), SIZES)
    assert len(graph.kiln_kernels) == 1 and not graph.kiln_fallbacks


@pytest.mark.parametrize("op", [
    lambda x: x.sum(0), lambda x: x.sum(-1), lambda x: x.mean(1, keepdim=True), lambda x: x.amax(0),
    lambda x: x.var(1), lambda x: x.std(0, correction=0), lambda x: x.argmax(1), lambda x: x.sum(),
    lambda x: torch.var_mean(x, 0),
], ids=["sum0", "sum-1", "mean1", "amax0", "var1", "std0", "argmax1", "sum_all", "var_mean0"])
def test_reductions_over_symbolic_dims(op):
    check_sizes(op, lambda n: (randn(n, 2 * n + 1),), SIZES, rtol=1e-4)


def test_reduction_over_a_static_dim_of_a_dynamic_tensor():
    def fn(x):
        return x.sum(-1) + x.amax(-1), torch.softmax(x, -1)
    graph = check_sizes(fn, lambda n: (randn(n, 24),), SIZES, dynamic=None, mark={0: 0})
    assert "row_" in graph.kiln_source  # softmax's exp row stays per thread, as with static sizes


def test_softmax_and_layer_norm_over_a_symbolic_batch():
    w, b = randn(40, seed=3), randn(40, seed=4)

    def fn(x):
        return torch.softmax(x, -1), F.layer_norm(x, (40,), w, b), torch.log_softmax(x, 0)
    check_sizes(fn, lambda n: (randn(n, 40),), SIZES, dynamic=None, mark={0: 0}, rtol=1e-4)


def test_softmax_over_a_symbolic_dim():
    graph = check_sizes(lambda x: torch.softmax(x * 2, -1), lambda n: (randn(3, n),), SIZES, rtol=1e-4)
    assert len(graph.kiln_kernels) == 1 and "row_" in graph.kiln_source  # exp(x - max) kept per thread


@pytest.mark.parametrize("op", [
    lambda x: x.reshape(-1, 4) * 2, lambda x: x.flatten() + 1, lambda x: x.permute(1, 0) * x.t(),
    lambda x: x[:, 1:-1] * 3, lambda x: x[1:] - x[:-1], lambda x: x[::2].exp(),
    lambda x: x.unsqueeze(1).expand(-1, 3, -1) + 0.5, lambda x: x.view(x.size(0), 2, -1).sum(1),
    lambda x: x.transpose(0, 1).contiguous().view(-1) * 2, lambda x: x[-1] * x[0] + x[:, -2].sum(),
], ids=["reshape", "flatten", "permute", "slice_inner", "slice_diff", "slice_step", "expand", "view_sym",
        "transpose_contiguous", "select_negative"])
def test_views_with_symbolic_sizes(op):
    graph = check_sizes(op, lambda n: (randn(n + 1, 8),), SIZES)
    assert not graph.kiln_fallbacks  # views are index maps, even -1 over two symbols (s0 * s1 // 4)


def test_cat_along_symbolic_and_static_dims():
    def fn(x, y):
        return torch.cat([x, y * 2], 0).relu(), torch.cat([x, x.sin()], 1)
    check_sizes(fn, lambda n: (randn(n, 6), randn(n + 2, 6, seed=1)), SIZES)


def test_embedding_and_indexing_with_a_symbolic_count():
    w = randn(50, 16, seed=5)

    def fn(idx, x):
        return F.embedding(idx, w) * 2, x[idx % x.size(0)] + 1, torch.gather(x, 1, idx[:, None] % 4)
    check_sizes(fn, lambda n: (torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(n)),
                               randn(n, 4)), SIZES)


def test_linear_and_matmul_externs_with_a_symbolic_batch():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)

    def fn(x, y):
        h = F.gelu(lin(x))
        return h, (x @ y).tanh(), torch.bmm(x, x.transpose(1, 2)).sum(-1)
    with torch.no_grad():
        graph = check_sizes(fn, lambda n: (randn(2, n, 16), randn(16, n, seed=1)), SIZES, rtol=1e-4)
    assert any("mm" in f for f in graph.kiln_fallbacks)  # the matmuls are aten's


def test_mixed_static_and_dynamic_inputs():
    def fn(x, y):
        return (x + y).sum(0) * y
    check_sizes(fn, lambda n: (randn(n, 12), randn(12, seed=1)), SIZES, dynamic=None, mark={0: 0})


def test_two_symbols():
    def fn(x, y):
        return (x.unsqueeze(-1) * y).sum(1), x.sum(1, keepdim=True) + y.mean()
    check_sizes(fn, lambda n: (randn(n, 2 * n + 1), randn(n + 2, seed=1)), SIZES)


def test_non_contiguous_inputs():
    def fn(x, y):
        return x * 2 + y, (x * y).sum(0)
    check_sizes(fn, lambda n: (randn(8, n).t(), randn(n, 16, seed=1)[:, ::2]), SIZES)


def test_inputs_with_an_offset_and_strides_that_are_not_sizes():
    """Strides become symbols of their own, read from the input's stride() by the wrapper."""
    def fn(x, y):
        return x * 2 + y.sum(-1, keepdim=True), x.sum(0)
    graph = check_sizes(fn, lambda n: (randn(n + 2, n + 7)[1:, 2:n + 2],
                                       randn(n + 1, 3, seed=1).double()[:, ::2]), SIZES)
    assert ".stride(" in graph.kiln_wrapper


def test_tiny_and_large_sizes_share_one_compile():
    """The work crosses the parallel threshold between calls: threads are decided at run time."""
    def fn(x):
        return (x.sin() * 2).sum(-1), x.cos() + 1, x.sum()
    graph = check_sizes(fn, lambda n: (randn(n, 600),), (2, 3, 700, 5, 400), dynamic=None, mark={0: 0}, rtol=1e-4)
    assert " if(" in graph.kiln_source


def test_outputs_that_are_views_of_inputs():
    def fn(x):
        return x.view(-1), x.t(), x[1:], x * 2
    # not size 2: tracing x[1:] to aten asks whether its 1-row result is contiguous (a guard on
    # n - 1 == 1), so size 2 would be a second compile (correct, as in torch.compile)
    check_sizes(fn, lambda n: (randn(n, 5),), (3, 7, 4, 16, 33))


def test_mutation_of_an_input():
    def fn(x, y):
        x.mul_(2)
        y[:, 0] = 7.0
        return x + y
    check_sizes(fn, lambda n: (randn(n, 4), randn(n, 4, seed=1)), SIZES)


def test_mark_dynamic_on_a_function():
    def fn(x):
        return torch.nn.functional.silu(x) * x.mean(0)
    check_sizes(fn, lambda n: (randn(n, 9),), SIZES, dynamic=None, mark={0: 0})


def test_sizes_as_scalars():
    """Sizes used as numbers (x.size(0) in arithmetic) are size expressions inside the kernel."""
    def fn(x):
        return x * x.size(1) + x.size(0), torch.arange(x.size(0)) * 2
    check_sizes(fn, lambda n: (randn(n, n + 1),), SIZES)


def test_floats_computed_from_sizes():
    """1.0 / x.size(1) is a SymFloat: the wrapper computes it in Python, kernels take it as a double."""
    def fn(x):
        return x * (1.0 / x.shape[1]), x * (x.size(1) * 0.5) + x.size(0) / 3, torch.full((2,), x.size(1) / 7.0)
    graph = check_sizes(fn, lambda n: (randn(n, n + 1),), SIZES)
    assert "const double" in graph.kiln_source and not graph.kiln_fallbacks


def test_backend_specialization_adds_a_guard_and_recompiles():
    """A backend that branches on a symbolic size (here: its parity) adds a guard to the capture's
    ShapeEnv; capture builds its guards after the backend ran, so a size on the other side of that
    branch compiles again instead of reusing code that is only right for the first side."""
    decisions = []

    def backend(gm, example_inputs):
        # (the first tensor input: a user backend's graph starts with the symbolic sizes, as torch's)
        fake = next(v for p in gm.graph.find_nodes(op="placeholder")
                    if isinstance(v := p.meta["example_value"], torch.Tensor))
        even = bool(fake.shape[0] % 2 == 0)  # guards on the parity of the symbolic size
        decisions.append(even)

        def run(*args):
            x = args[-1]
            (out,) = gm(*args)
            # code that is only right for the parity it was compiled for
            return (out if (x.shape[0] % 2 == 0) == even else out * 0,)
        return run

    def fn(x):
        return x + 1
    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    for n in (4, 6, 5, 7, 8):
        x = randn(n, 3)
        torch.testing.assert_close(compiled(x), fn(x))
    assert decisions == [True, False]


def test_a_source_whose_rank_changes_keeps_compiling():
    """Automatic dynamic remembers dim 2 of a 3-d input changing; a later 2-d input from the same
    source (one code object serves many modules' calls) must not trip over that dim."""
    counter = CompileCounter()
    fn = lambda x: x * 2  # noqa: E731
    compiled = kiln.compile(fn, backend=counter)
    for shape in ((2, 3, 4), (2, 3, 5), (2, 3), (2, 4)):
        x = randn(*shape)
        torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 4  # static, dim 2 dynamic, 2-d static, 2-d dim 1 dynamic


def pad_to_multiple_of_7(x):
    """The remainder of a negative size: (-n) % 7 is 7 - n % 7 in Python, -(n % 7) in C."""
    pad = (-x.shape[1]) % 7
    y = F.pad(x, (0, pad))
    return y.reshape(x.shape[0], -1, 7).sum(-1) + 1


def test_remainders_and_floor_divisions_of_negative_sizes_floor_as_in_python():
    graph = check_sizes(pad_to_multiple_of_7, lambda n: (randn(2, n),), (8, 13, 9, 16))
    assert "kiln_remainder<int64_t>" in graph.kiln_source  # the helper, not C's %
