"""Training-step code inside the region: backward() and in-place parameter updates under no_grad.
Gradients and parameters after the call equal eager's."""
import copy

import pytest
import torch
from torch import nn

import kiln
from tests.utils import CompileCounter


def sgd_update(params, lr):
    with torch.no_grad():
        for p in params:
            p.sub_(p.grad * lr)
            p.grad.zero_()


def train_step(model, x, lr=0.1):
    loss = model(x).square().mean()
    loss.backward()
    sgd_update(list(model.parameters()), lr)
    return loss.detach()


def two_models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, copy.deepcopy(model)


def assert_params_equal(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)
        torch.testing.assert_close(p.grad, q.grad)


def test_compiled_sgd_update():
    eager, model = two_models()
    x = torch.randn(3, 4)
    for m in (eager, model):
        m(x).sum().backward()
    sgd_update(list(eager.parameters()), 0.5)
    kiln.compile(sgd_update, backend=CompileCounter())(list(model.parameters()), 0.5)
    assert_params_equal(model, eager)


def test_compiled_train_step_with_backward():
    eager, model = two_models()
    compiled = kiln.compile(train_step, backend=CompileCounter())
    for _ in range(3):
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(model, x), train_step(eager, x))
    assert_params_equal(model, eager)


def test_optimizer_step_outside_compiled_forward():
    eager, model = two_models()
    compiled = kiln.compile(model, backend=CompileCounter())
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_m = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x = torch.randn(3, 4)
        for m, opt in ((eager, opt_e), (compiled, opt_m)):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    assert_params_equal(model, eager)


def _masked_write(x, mask, v):
    x = x.clone()
    x[mask] = v
    return x


def _masked_column_write(x, mask, v):
    x = x.clone()
    x[:, mask] = v
    return x


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn, shape", [(_masked_write, (4,)), (_masked_column_write, (3, 4))])
def test_boolean_mask_assignment_trains(fn, shape, backend):
    """The backward of x[mask] = v reads v's gradient at the mask's true places: a size known only
    from the data (nonzero), which the training trace needs symbolic sizes for."""
    mask = torch.tensor([True, False, True, False])
    x, v = torch.randn(*shape, requires_grad=True), torch.randn(2, requires_grad=True)
    out = kiln.compile(fn, backend=backend)(x, mask, v)
    ref = fn(x, mask, v)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(out, (x, v), g), torch.autograd.grad(ref, (x, v), g)):
        torch.testing.assert_close(got, want)


def _two_backwards(a, b):
    h = a @ torch.ones(2, 2)
    (h - 1).abs().mean().backward()  # frees h's graph, as eager does
    (b @ h.detach()).mean().backward()  # the second graph gets h but only uses it detached


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_graph_input_used_only_detached_keeps_autograd_out_of_its_history(backend):
    a, b = torch.randn(2, 2, requires_grad=True), torch.randn(2, 2, requires_grad=True)
    a2, b2 = a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    _two_backwards(a, b)
    kiln.compile(_two_backwards, backend=backend)(a2, b2)
    torch.testing.assert_close(a2.grad, a.grad)
    torch.testing.assert_close(b2.grad, b.grad)


def _flat_and_whole(x):
    doubled = x * 2
    return doubled.view(-1), doubled


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_outputs_that_view_one_another_stay_writable_views_in_training(backend):
    x = torch.randn(2, 3, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    flat, whole = _flat_and_whole(x)
    got_flat, got_whole = kiln.compile(_flat_and_whole, backend=backend)(x2)
    flat.mul_(3)
    got_flat.mul_(3)  # a view of another output: writing through it is legal and seen by both, as in eager
    torch.testing.assert_close(got_whole, whole)
    assert got_flat._base is got_whole
    (whole.sum() + flat.sum()).backward()
    (got_whole.sum() + got_flat.sum()).backward()
    torch.testing.assert_close(x2.grad, x.grad)
