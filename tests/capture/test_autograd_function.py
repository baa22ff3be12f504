"""torch.autograd.Function.apply in compiled code: the forward goes into the graph, the user's backward
(not autograd's derivative of the forward) computes the gradients, and what cannot be traced is a clean
graph break. Eager is the oracle: results and gradients compared on every backend."""
import os
import re

import pytest
import torch
from torch import nn

import kiln
from tests.utils import CompileCounter, counting_backend

PEER = os.environ.get("KILN_TEST_PEER") == "torch"
BACKENDS = ["eager", "aot_eager", "inductor"]


class ScaledTanh(torch.autograd.Function):
    """tanh(x) * scale whose backward is deliberately 3x the true derivative: only the user's backward
    gives these gradients."""

    @staticmethod
    def forward(ctx, x, scale=2.0):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return torch.tanh(x) * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        shift = ctx.shift if hasattr(ctx, "shift") else 0.0  # never set: hasattr is False
        return grad * ctx.scale * 3.0 * (1 - torch.tanh(x) ** 2) + shift, None


def leaves(*tensors, requires_grad=True):
    """Two independent copies of each tensor, as leaves (eager's and the compiled run's)."""
    first = [t.detach().clone().requires_grad_(requires_grad and t.is_floating_point()) for t in tensors]
    second = [t.detach().clone().requires_grad_(requires_grad and t.is_floating_point()) for t in tensors]
    return first, second


def check_training(fn, *tensors, backend="eager", graphs=1, fullgraph=True, loss=lambda out: out.sum(),
                   requires_grad=None, **compile_kwargs):
    """fn eagerly and compiled: results and the gradients of every input equal; returns the counter."""
    counter = counting_backend(backend)
    compiled = kiln.compile(fn, backend=counter, fullgraph=fullgraph, **compile_kwargs)
    eager_in, compiled_in = leaves(*tensors)
    if requires_grad is not None:
        for e, c, r in zip(eager_in, compiled_in, requires_grad):
            e.requires_grad_(r)
            c.requires_grad_(r)
    expected, actual = fn(*eager_in), compiled(*compiled_in)
    loss(expected).backward()
    loss(actual).backward()
    torch.testing.assert_close(actual, expected)
    for e, c in zip(eager_in, compiled_in):
        if e.grad is None:
            assert c.grad is None
        else:
            torch.testing.assert_close(c.grad, e.grad)
    if graphs is not None:
        assert counter.frame_count == graphs
    return counter


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_backward_gives_the_gradients(backend):
    def fn(x, w):
        return ScaledTanh.apply(x @ w, 1.5).sum(-1)
    check_training(fn, torch.randn(3, 4), torch.randn(4, 5), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_argument_and_ctx_attribute(backend):
    def fn(x):
        return ScaledTanh.apply(x) + 1
    check_training(fn, torch.randn(6), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_grad_the_forward_is_inlined(backend):
    def fn(x):
        return ScaledTanh.apply(x * 2, 0.5)
    counter = counting_backend(backend)
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    x = torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))  # no input requires grad: no backward either
    assert counter.frame_count == 2  # one graph per grad mode


class TopValue(torch.autograd.Function):
    """Returns (max values, their indices); the indices are marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, idx = x.max(dim=-1)
        ctx.save_for_backward(idx)
        ctx.mark_non_differentiable(idx)
        ctx.width = x.shape[-1]
        return values, idx

    @staticmethod
    def backward(ctx, grad_values, grad_idx):
        (idx,) = ctx.saved_tensors
        grad = torch.zeros(idx.shape + (ctx.width,), dtype=grad_values.dtype)
        return grad.scatter(-1, idx.unsqueeze(-1), grad_values.unsqueeze(-1) * 2.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_non_differentiable_and_two_outputs(backend):
    def fn(x):
        values, idx = TopValue.apply(x)
        assert not idx.requires_grad
        return values * 3 + idx
    check_training(fn, torch.randn(4, 7), backend=backend)


class MulAdd(torch.autograd.Function):
    """x * y + z; backward computes only the gradients ctx.needs_input_grad asks for."""

    @staticmethod
    def forward(ctx, x, y, z):
        ctx.save_for_backward(x, y)
        return x * y + z

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        gx = gy = gz = None
        if ctx.needs_input_grad[0]:
            gx = grad * y
        if ctx.needs_input_grad[1]:
            gy = grad * x * 0.5  # not the true derivative, on purpose
        if ctx.needs_input_grad[2]:
            gz = grad
        return gx, gy, gz


@pytest.mark.parametrize("requires_grad", [(True, True, True), (True, False, True), (False, True, False)])
def test_needs_input_grad(requires_grad):
    def fn(x, y, z):
        return MulAdd.apply(x, y, z)
    check_training(fn, torch.randn(5), torch.randn(5), torch.randn(5), requires_grad=requires_grad,
                   backend="aot_eager")


class Projection(nn.Module):
    """A module whose forward calls a Function that reads the module's weight from its closure: the
    weight gets no gradient through the Function (apply's inputs only), as in eager."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.bias = nn.Parameter(torch.randn(4))
        module = self

        class Project(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x @ module.weight

            @staticmethod
            def backward(ctx, grad):
                return grad @ module.weight.t() + 1.0

        self.project = Project

    def forward(self, x):
        return self.project.apply(x) + self.bias


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_reading_a_parameter_of_its_closure(backend):
    torch.manual_seed(0)
    eager_model, compiled_model = Projection(), Projection()
    compiled_model.load_state_dict(eager_model.state_dict())
    x = torch.randn(3, 4)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    counter = counting_backend(backend)
    compiled = kiln.compile(compiled_model, backend=counter, fullgraph=True)
    eager_model(xe).square().sum().backward()
    compiled(xc).square().sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(compiled_model.bias.grad, eager_model.bias.grad)
    assert eager_model.weight.grad is None and compiled_model.weight.grad is None
    assert counter.frame_count == 1


class SquareSetup(torch.autograd.Function):
    """The forward-without-ctx style: setup_context saves what backward needs, including an output."""

    @staticmethod
    def forward(x, power):
        return x ** power

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, power = inputs
        ctx.power = power
        ctx.save_for_backward(x, output)

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad * ctx.power * out / x, None


@pytest.mark.parametrize("backend", BACKENDS)
def test_setup_context_and_saved_output(backend):
    def fn(x):
        return SquareSetup.apply(x, 3)
    check_training(fn, torch.rand(6) + 0.5, backend=backend)


def test_apply_keyword_arguments_like_eager():
    """torch 2.13+ binds keywords to the forward of a Function with a setup_context; torch 2.11 raises
    TypeError for any keyword to apply. Compiled code does what this torch's eager does."""
    def fn(x):
        return SquareSetup.apply(x, power=3)
    x = torch.rand(6) + 0.5
    try:
        fn(x)
    except TypeError as e:
        with pytest.raises(TypeError, match=re.escape(str(e))):
            kiln.compile(fn, backend="eager")(x)
        with pytest.raises(kiln.Unsupported, match="keyword arguments to Function.apply"):
            kiln.compile(fn, backend="eager", fullgraph=True)(x)
        return
    check_training(fn, x, backend="eager")


class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.exp() * 2


def test_once_differentiable_backward():
    def fn(x):
        return OnceDifferentiable.apply(x).sum()
    check_training(fn, torch.randn(5), backend="aot_eager")


class UnusedOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * 2 + g2 * 3 + 1  # g2 is zeros when the second output is unused


@pytest.mark.parametrize("backend", BACKENDS)
def test_unused_output_gets_zero_gradient(backend):
    def fn(x):
        a, b = UnusedOutput.apply(x)
        return a.sin()
    check_training(fn, torch.randn(5), backend=backend)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_dynamic_sizes_one_compile(backend):
    def fn(x):
        return TopValue.apply(x.tanh())[0]
    counter = counting_backend(backend)
    compiled = kiln.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    for rows, cols in ((3, 5), (4, 9), (6, 2)):
        x = torch.randn(rows, cols)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        fn(xe).sum().backward()
        compiled(xc).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)
    assert counter.frame_count == 1


class DataDependent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.sum() > 0:  # needs the tensor's data in Python
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        return grad * 5


class WritesInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 7


CALLS = []


class BackwardWithSideEffect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        CALLS.append("backward")  # must happen when backward runs, not when the forward does
        return grad * 2


@pytest.mark.parametrize("function", [DataDependent, BackwardWithSideEffect])
def test_untraceable_function_breaks_cleanly(function):
    def fn(x):
        y = x.sin()
        return function.apply(y).cos()
    CALLS.clear()
    check_training(fn, torch.randn(4), fullgraph=False, graphs=None)
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter)
    out = compiled(torch.randn(4, requires_grad=True))
    assert counter.frame_count >= 2  # a break: graphs before and after it
    if function is BackwardWithSideEffect:
        assert CALLS == ["backward"] * 2  # eager's and the compiled run's, at backward time
        out.sum().backward()
        assert CALLS == ["backward"] * 3
    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(4, requires_grad=True))


def test_forward_writing_its_input():
    def fn(x):
        return WritesInput.apply(x.clone()) + 1
    check_training(fn, torch.randn(4), fullgraph=False, graphs=None)


@pytest.mark.skipif(PEER, reason="torch.compile traces mark_dirty; kiln breaks there")
def test_forward_writing_its_input_is_a_break_under_fullgraph():
    def fn(x):
        return WritesInput.apply(x.clone()) + 1
    with pytest.raises(kiln.Unsupported, match="mark_dirty"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(4, requires_grad=True))


@pytest.mark.skipif(PEER, reason="inspects kiln's graph")
def test_graph_holds_one_node_for_the_function():
    def fn(x):
        return ScaledTanh.apply(x).sum()
    counter = CompileCounter()
    kiln.compile(fn, backend=counter, fullgraph=True)(torch.randn(3, requires_grad=True))
    targets = [n.target for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert [getattr(t, "__name__", "") for t in targets].count("ScaledTanh_apply") == 1


@pytest.mark.torch_differs("torch.compile breaks the graph on a tensor passed to apply twice (fullgraph raises)")
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_tensor_passed_twice(backend):
    """Each argument gets its own gradient from backward; autograd sums them for the one tensor."""
    def fn(x):
        return MulAdd.apply(x, x, x * 2)
    check_training(fn, torch.randn(5), backend=backend)


scaled_tanh = ScaledTanh.apply  # the common alias; a C method on torch >= 2.14: a new object at each read


def test_apply_read_each_call_compiles_once():
    """`ScaledTanh.apply` read from the class (a new bound method at each read on torch >= 2.14) and
    through an alias: guarded by equality (same class, same function), not identity, so later calls
    reuse the compiled code."""
    def fn(x):
        return scaled_tanh(x, 0.5) * ScaledTanh.apply(x)
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 1
