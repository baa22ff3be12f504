"""A backend written for torch.compile gets what torch.compile gives it: a TracingContext holding the
fake mode capture used, and symbolic number inputs as capture's SymInts. A backend that traces the
graph again (functorch's aot_module_simplified, as a user would call it) then traces with kiln's
symbols, and whatever it specializes is guarded: compiled equals eager for every value, never the
first call's answer."""
import pytest
import torch
import torch._guards
from functorch.compile import make_boxed_func
from torch.fx.experimental.proxy_tensor import make_fx
from torch._functorch.aot_autograd import aot_module_simplified

import kiln


def aot_backend(gm, example_inputs):
    """The smallest AOT backend a user writes: trace fw/bw with AOT, run its graphs as they are."""
    return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g.forward))


class Counted:
    """`backend`, counting the graphs it compiles."""

    def __init__(self, backend):
        self.backend, self.frame_count = backend, 0

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        return self.backend(gm, example_inputs)


def scaled_sum(a, b, k):
    return torch.add(a, b, alpha=k)


@pytest.mark.parametrize("dynamic", [True, None])
def test_aot_backend_follows_an_int_argument(dynamic):
    compiled = kiln.compile(scaled_sum, backend=aot_backend, dynamic=dynamic)
    for k in (5, 6, -2, 9):
        a = torch.linspace(0, 1, 4, requires_grad=True)
        b = torch.linspace(1, 2, 4, requires_grad=True)
        out = compiled(a, b, k)
        expected = scaled_sum(a.detach(), b.detach(), k)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        torch.testing.assert_close(b.grad, torch.full((4,), float(k)))


def mean_rows(x, k):
    n = x.shape[0]
    return x.reshape(n // 2, 2).sum(1) / n * k


def test_aot_backend_follows_symbolic_sizes():
    counter = Counted(aot_backend)
    compiled = kiln.compile(mean_rows, backend=counter, dynamic=True)
    for n, k in ((4, 3), (6, 3), (10, 4), (8, 1)):
        x = torch.arange(float(n))
        torch.testing.assert_close(compiled(x, k), mean_rows(x, k))
    assert counter.frame_count == 1


def test_a_backend_that_specializes_an_int_is_guarded():
    """A backend that reads a number input's value and builds it into what it returns: the read is
    a guard on kiln's symbol, so another value compiles again instead of reusing that code."""
    def baking_backend(gm, example_inputs):
        k = int(example_inputs[-1])
        return lambda *args: gm(*args[:-1], k)
    counter = Counted(baking_backend)
    compiled = kiln.compile(scaled_sum, backend=counter, dynamic=True)
    a, b = torch.ones(3), torch.arange(3.0)
    for k in (2, 3, 2):
        torch.testing.assert_close(compiled(a, b, k), scaled_sum(a, b, k))
    assert counter.frame_count == 2


def test_user_backend_runs_in_a_tracing_context_with_the_graphs_shape_env():
    seen = []

    def backend(gm, example_inputs):
        ctx = torch._guards.TracingContext.try_get()
        fakes = [v for v in (n.meta["example_value"] for n in gm.graph.find_nodes(op="placeholder"))
                 if isinstance(v, torch.Tensor)]
        # (torch.compile gives the backend a fake mode of its own over capture's ShapeEnv)
        seen.append((ctx is not None and ctx.fake_mode.shape_env is fakes[0].fake_mode.shape_env,
                     torch._guards.detect_fake_mode(example_inputs) is ctx.fake_mode,
                     [type(e) for e in example_inputs if not isinstance(e, torch.SymInt)],
                     type(example_inputs[-1])))
        return gm.forward
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(kiln.compile(scaled_sum, backend=backend, dynamic=True)(x, y, 3), scaled_sum(x, y, 3))
    # (torch.compile also passes each symbolic size as an input of its own)
    assert seen == [(True, True, [torch.Tensor, torch.Tensor], torch.SymInt)]
    assert torch._guards.TracingContext.try_get() is None


def static_shape_backend(gm, example_inputs):
    """A compiler for exactly the sizes and numbers it is shown (as static-shape compilers are): it
    reads each number input's value and traces the graph on the real tensors."""
    concrete = [int(e) if isinstance(e, torch.SymInt) else e for e in example_inputs]
    traced = make_fx(gm)(*concrete)
    return lambda *args: traced(*args)


def rows_of_pairs(x, k):
    return x.reshape(x.shape[0] // 2, -1).sum(1) * k + x.size(1)


def test_a_backend_tracing_on_real_tensors_never_bakes_a_dynamic_size_in():
    """Each symbolic size reaches the backend as an input of its own (as in torch.compile): a backend
    that specializes on it guards it, so another size compiles again; the graph never reads a size
    off the example tensor behind kiln's back (that answered every size with the first one's code)."""
    counter = Counted(static_shape_backend)
    compiled = kiln.compile(rows_of_pairs, backend=counter, dynamic=True)
    for n, m in ((4, 3), (6, 3), (4, 3), (8, 5)):
        x = torch.randn(n, m)
        torch.testing.assert_close(compiled(x, 2), rows_of_pairs(x, 2))
    assert counter.frame_count == 3
