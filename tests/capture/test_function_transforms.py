"""torch.func transforms (vmap, grad, jacrev...) inside compiled code: one graph (the vmapped function traced on one sample, vmapped as a
node), equal to eager in results, gradients and after-call state; what cannot be traced breaks cleanly."""
import copy

import pytest
import torch
from torch.func import grad, grad_and_value, hessian, jacfwd, jacrev, vmap

import kiln

W = torch.randn(4, 4)


def _sum_scaled(r):
    return r * r.sum()


def _loss(x):
    return (x.sin() @ W[:, :3]).pow(2).sum()


def _outer_twice(x):
    outer = torch.vmap(torch.outer, in_dims=(0, None))
    v = torch.arange(3.0)
    return outer(x, v) + outer(x * 2, v)


PROGRAMS = {
    "default_dims": (lambda x: torch.vmap(_sum_scaled)(x), lambda: (torch.randn(3, 4),)),
    "in_dims_with_none": (lambda x, y: torch.vmap(lambda a, b: a @ b, in_dims=(1, None))(x, y),
                          lambda: (torch.randn(4, 5), torch.randn(4, 2))),
    "negative_in_dim": (lambda x: torch.vmap(lambda r: r.cumsum(0), in_dims=-1)(x), lambda: (torch.randn(4, 3),)),
    "global_weight": (lambda x: torch.vmap(lambda r: (r @ W).relu())(x) + 1, lambda: (torch.randn(3, 4),)),
    "two_outputs_out_dims": (lambda x: torch.vmap(lambda r: (r.sum(), r * 2), out_dims=(0, 1))(x),
                             lambda: (torch.randn(3, 4),)),
    "nested": (lambda x: torch.vmap(torch.vmap(lambda v: v.exp() + 1))(x), lambda: (torch.randn(2, 3, 4),)),
    "module": (lambda x, m: torch.vmap(m)(x), lambda: (torch.randn(3, 2, 4), torch.nn.Linear(4, 3))),
    "chunked": (lambda x: torch.vmap(lambda r: r.softmax(-1), chunk_size=2)(x), lambda: (torch.randn(5, 7),)),
    "vmapped_function_called_twice": (lambda x: _outer_twice(x), lambda: (torch.randn(3, 4),)),
    "grad": (lambda x: grad(_loss)(x) * 2, lambda: (torch.randn(5, 4),)),
    "grad_argnums": (lambda x, y: grad(lambda a, b: (a * b).sin().sum(), argnums=(0, 1))(x, y),
                     lambda: (torch.randn(3), torch.randn(3))),
    "grad_and_value": (lambda x: grad_and_value(_loss)(x), lambda: (torch.randn(5, 4),)),
    "grad_has_aux": (lambda x: grad(lambda a: ((a ** 2).sum(), a.mean()), has_aux=True)(x), lambda: (torch.randn(3),)),
    "jacrev": (lambda x: jacrev(torch.sin)(x), lambda: (torch.randn(3),)),
    "jacfwd": (lambda x: jacfwd(lambda a: a.exp() * a.sum())(x), lambda: (torch.randn(3),)),
    "hessian": (lambda x: hessian(lambda a: (a ** 3).sum())(x), lambda: (torch.randn(3),)),
    "per_sample_grads": (lambda x: vmap(grad(lambda r: (r @ W).tanh().sum()))(x), lambda: (torch.randn(6, 4),)),
    "grad_of_grad": (lambda x: grad(lambda a: grad(lambda b: b.sin().sum())(a).sum())(x), lambda: (torch.randn(3),)),
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_transform_is_one_graph_equal_to_eager(name, dynamic):
    fn, make = PROGRAMS[name]
    args = make()
    expected = fn(*copy.deepcopy(args))
    kiln.reset()
    explained = kiln.explain(fn)(*copy.deepcopy(args))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    kiln.reset()
    actual = kiln.compile(fn, dynamic=dynamic)(*copy.deepcopy(args))
    torch.testing.assert_close(actual, expected)


def test_gradients_through_vmap_equal_eager():
    def loss(x, w):
        return torch.vmap(lambda r: (r.sin() @ w).sum())(x).sum()
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
    expected = torch.autograd.grad(loss(x, w), (x, w))
    kiln.reset()
    actual = torch.autograd.grad(kiln.compile(loss)(x, w), (x, w))
    torch.testing.assert_close(actual, expected)


def test_grad_under_the_programs_saved_tensor_hooks_raises_as_eager():
    # torch.func.grad refuses saved-tensor hooks; kiln's own (hiding the program's while it compiles)
    # are lifted for the traced transform, the program's are not
    def fn(x):
        return grad(lambda a: a.sin().sum())(x)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        with pytest.raises(RuntimeError):
            fn(torch.randn(3))
        kiln.reset()
        with pytest.raises(RuntimeError):
            kiln.compile(fn)(torch.randn(3))


def test_vmapped_function_with_python_side_effects_runs_natively():
    # a list append inside the vmapped function happens once per vmap call in eager; a graph cannot
    # replay it per sample, so the call breaks and runs natively, with the same after-call state
    def fn(x, log):
        def step(r):
            log.append(r.dim())
            return r + 1
        return torch.vmap(step)(x) * 2
    x = torch.randn(3, 4)
    eager_log, kiln_log = [], []
    expected = fn(x, eager_log)
    kiln.reset()
    explained = kiln.explain(fn)(x, [])
    assert any("changes Python state" in str(r) for r in explained.break_reasons)
    kiln.reset()
    actual = kiln.compile(fn)(x, kiln_log)
    torch.testing.assert_close(actual, expected)
    assert kiln_log == eager_log


def test_vmap_over_a_function_that_breaks_runs_natively_and_matches():
    def fn(x):
        def step(r):
            print("sample", end="")
            return r * 3
        return torch.vmap(step)(x).sum(0)
    x = torch.randn(3, 4)
    expected = fn(x)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn)(x), expected)


def test_vmap_randomness_error_raises_as_eager():
    def fn(x):
        return torch.vmap(lambda r: r + torch.rand(4))(x)
    with pytest.raises(RuntimeError) as eager_error:
        fn(torch.randn(3, 4))
    kiln.reset()
    with pytest.raises(RuntimeError) as kiln_error:
        kiln.compile(fn)(torch.randn(3, 4))
    assert "randomness" in str(kiln_error.value) and "randomness" in str(eager_error.value)
