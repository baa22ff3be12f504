"""The device seam: generated kernels (the C++ backend) only ever touch CPU memory; an op on a tensor
of a device kiln has no kernel backend for (meta here; cuda on this machine's torch) runs through
aten, and a graph mixing devices compiles its CPU part into kernels. Before, a meta input reached a
C++ kernel as a null pointer: SIGSEGV. Eager is the oracle: results have eager's device, shape,
dtype and strides (meta tensors have no values)."""
import pytest
import torch

import kiln
from kiln.compiler import compile_fx

META = torch.device("meta")


def describe(value):
    """What can be compared of a (possibly meta) result: device, shape, dtype, strides."""
    if isinstance(value, torch.Tensor):
        return value.device, tuple(value.shape), value.dtype, value.stride(), value.requires_grad
    if isinstance(value, (tuple, list)):
        return type(value), [describe(v) for v in value]
    return value


def check(fn, *args, **compile_kwargs):
    kiln.reset()
    expected = describe(fn(*args))
    assert describe(kiln.compile(fn, **compile_kwargs)(*args)) == expected
    return expected


FUNCTIONS = {
    "sum_of_scaled": lambda x: (x * 2).sum(0),
    "softmax": lambda x: torch.softmax(x, -1) + x.mean(),
    "views": lambda x: (x.t()[1:], x.view(-1), x[:, None]),
    "matmul": lambda x: x @ x.t(),
    "in_place": lambda x: x.clone().add_(1).mul(2),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (5,)),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_meta_inputs_give_eager_meta_results(name, dynamic):
    check(FUNCTIONS[name], torch.empty(4, 5, device=META), dynamic=dynamic)


def test_meta_input_mutated_in_place():
    x, y = torch.empty(4, 5, device=META), torch.empty(4, 5, device=META)
    check(lambda x: x.add_(1).mul(2), x)
    assert describe(x) == describe(y.add_(1))


def test_a_cpu_scalar_tensor_with_a_meta_tensor():
    check(lambda x, s: x * s + 1, torch.empty(4, 5, device=META), torch.tensor(3.0))


def test_meta_module_parameters():
    with torch.device(META):
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    check(model, torch.empty(3, 4, device=META))


def test_meta_tensor_created_inside_the_function():
    check(lambda x: x.sum() + torch.zeros(3, device=META), torch.randn(4, 5))
    check(lambda x: torch.ones(2, 5, device=META) * 2 + x.to(META), torch.randn(2, 5))


def test_training_through_aot_with_meta_tensors():
    with torch.device(META):
        eager_model = torch.nn.Linear(4, 3)
        kiln_model = torch.nn.Linear(4, 3)

    def step(model, x):
        loss = model(x).relu().sum()
        loss.backward()
        return loss
    x = torch.empty(2, 4, device=META, requires_grad=True)
    kiln.reset()
    expected = describe(step(eager_model, x))
    assert describe(kiln.compile(step)(kiln_model, x)) == expected
    for p in kiln_model.parameters():
        assert p.grad is not None and p.grad.device == META and p.grad.shape == p.shape


def test_mixed_device_graph_compiles_its_cpu_part():
    def fn(x, m):
        return (x * 2).sin(), m + 1
    x, m = torch.randn(3, 4), torch.empty(4, device=META)
    compiled = compile_fx(torch.fx.symbolic_trace(fn), [x, m], {"graph_cache": False})
    out_x, out_m = compiled(x, m)
    torch.testing.assert_close(out_x, (x * 2).sin())
    assert describe(out_m) == describe(m + 1)
    assert compiled.kiln_kernels, "the CPU part ran through aten"
    assert any("add" in f for f in compiled.kiln_fallbacks), compiled.kiln_fallbacks


def test_no_kernel_takes_a_pointer_to_another_device():
    # the seam proven on the generated code: the meta input is no argument of any native entry
    x, m = torch.randn(3, 4), torch.empty(3, 4, device=META)
    compiled = compile_fx(torch.fx.symbolic_trace(lambda x, m: (x + 1, (m * x.sum()).exp())), [x, m],
                          {"graph_cache": False})
    assert compiled.kiln_kernels
    assert "p_arg1" not in compiled.kiln_source
