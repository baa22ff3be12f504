"""The training graph's per-call path (kiln.compiler.training.RuntimePlan): the fast path for
graphs without writes or aliases gives eager's output structure and gradients; the general path
still handles writes, inputs without grad and non-contiguous output gradients."""
import pytest
import torch
import torch.fx as fx

from kiln.compiler.training import TrainingGraph


def compiled(fn, args, inner):
    return TrainingGraph(fx.symbolic_trace(fn), fresh(args), {}, inner, True)


def fresh(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


def leaves(*shapes, grad=True):
    torch.manual_seed(0)
    return [torch.randn(*s, requires_grad=grad) for s in shapes]


def single(x, w):
    return torch.tanh(x @ w)


def flat_tuple(x, w):
    return torch.tanh(x @ w), (x * 2).sum(0)


def as_list(x, w):
    return [x @ w, x.exp()]


def nested(x, w):
    return {"y": x @ w, "pair": (x.sin(), (x @ w).sum())}


def writes_input(x, w):
    w.mul_(1)  # an in-place write: the general path
    return x @ w


def total(out):
    return sum(t.float().sum() for t in torch.utils._pytree.tree_leaves(out))


@pytest.mark.parametrize("inner", ["eager", "cpp"])
@pytest.mark.parametrize("fn", [single, flat_tuple, as_list, nested])
def test_output_structures_and_gradients_match_eager(fn, inner):
    args = leaves((6, 4), (4, 5))
    eager_args, compiled_args = fresh(args), fresh(args)
    graph = compiled(fn, args, inner)
    assert graph.plan.outputs_are_results
    expected, actual = fn(*eager_args), graph(*compiled_args)
    assert type(actual) is type(expected)
    assert torch.utils._pytree.tree_structure(actual) == torch.utils._pytree.tree_structure(expected)
    torch.testing.assert_close(actual, expected)
    total(expected).backward()
    total(actual).backward()
    for c, e in zip(compiled_args, eager_args):
        torch.testing.assert_close(c.grad, e.grad)


def test_write_to_input_takes_general_path():
    x, w = leaves((6, 4), (4, 5), grad=False)
    x.requires_grad_(True)
    graph = compiled(writes_input, [x, w], "eager")
    assert not graph.plan.outputs_are_results
    assert not graph.plan.all_inputs_need_grad
    xc, wc = fresh([x, w])
    graph(xc, wc).sum().backward()
    xe, we = fresh([x, w])
    writes_input(xe, we).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)


@pytest.mark.parametrize("inner", ["eager", "cpp"])
def test_non_contiguous_output_gradient(inner):
    """The loss reads the output transposed, so its gradient arrives with transposed strides."""
    args = leaves((6, 4), (4, 5))
    weight = torch.randn(5, 6)
    eager_args, compiled_args = fresh(args), fresh(args)
    (single(*eager_args).t() * weight).sum().backward()
    (compiled(single, args, inner)(*compiled_args).t() * weight).sum().backward()
    for c, e in zip(compiled_args, eager_args):
        torch.testing.assert_close(c.grad, e.grad)
