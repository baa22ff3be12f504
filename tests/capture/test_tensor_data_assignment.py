"""`t.data = v` in a compiled frame: t keeps its identity and autograd state and takes v's data, in
program order with other assignments; results, both tensors after the call and gradients as eager."""
import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_same, clone_args


def adopt_then_scale(w, v):
    w.data = v
    w.mul_(3)  # writes v's storage, which w now shares
    return w + 1


def test_an_in_place_op_after_the_assignment_writes_the_new_data():
    counter = CompileCounter()
    compiled = kiln.compile(adopt_then_scale, backend=counter, fullgraph=True)
    assert_same(adopt_then_scale, compiled, torch.zeros(4), torch.arange(4.0))
    w, v = torch.zeros(4), torch.arange(4.0)
    compiled(w, v)
    assert w.data_ptr() == v.data_ptr()  # shared storage afterwards, as in eager
    assert counter.frame_count == 1


def chain(a, b, c):
    first = a
    a.data = b  # a takes b's data as it is now...
    b.data = c * 2  # ...not this
    return a, b, a is first, a.shape


def test_assignments_replay_in_program_order():
    counter = CompileCounter()
    compiled = kiln.compile(chain, backend=counter, fullgraph=True)
    args = torch.ones(2), torch.arange(3.0), torch.full((5,), 7.0)
    eager_args, compiled_args = clone_args(args), clone_args(args)
    expected, actual = chain(*eager_args), compiled(*compiled_args)
    assert actual[0] is compiled_args[0] and actual[1] is compiled_args[1]
    assert actual[2:] == expected[2:]
    for a, e in zip(compiled_args, eager_args):
        torch.testing.assert_close(a, e)
    assert counter.frame_count == 1


def tagged_then_replaced(t, v):
    t.tag = "kept"
    t.data = v
    return t.tag, t.sum()


def test_python_attributes_of_the_tensor_survive_the_assignment():
    compiled = kiln.compile(tagged_then_replaced, backend=CompileCounter(), fullgraph=True)
    t, v = torch.zeros(2), torch.arange(3.0)
    assert compiled(t, v) == ("kept", torch.tensor(3.0))
    assert t.tag == "kept" and t.shape == (3,)


def leaf_takes_new_data(p, v):
    p.data = v.detach() * 2
    return p


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_leaf_requiring_grad_keeps_its_gradient(backend):
    compiled = kiln.compile(leaf_takes_new_data, backend=backend, fullgraph=True)
    eager_p, compiled_p = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    v = torch.arange(3.0, requires_grad=True)
    assert compiled(compiled_p, v) is compiled_p
    leaf_takes_new_data(eager_p, v)
    torch.testing.assert_close(compiled_p, eager_p)
    grad = torch.randn(3)
    compiled_p.backward(grad)
    eager_p.backward(grad)
    torch.testing.assert_close(compiled_p.grad, eager_p.grad)
    assert compiled_p.is_leaf and compiled_p.requires_grad


def uses_the_leaf_after(p, v):
    p.data = v
    return p * 2


def test_an_op_on_a_replaced_leaf_requiring_grad_breaks_the_graph():
    """Its gradient belongs to p, which the graph cannot express: the op runs natively."""
    compiled = kiln.compile(uses_the_leaf_after, backend=CompileCounter())
    eager_p, compiled_p = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    v = torch.arange(3.0)
    out_c, out_e = compiled(compiled_p, v), uses_the_leaf_after(eager_p, v)
    torch.testing.assert_close(out_c, out_e)
    out_c.sum().backward()
    out_e.sum().backward()
    torch.testing.assert_close(compiled_p.grad, eager_p.grad)
    with pytest.raises(kiln.Unsupported, match="data"):
        kiln.compile(uses_the_leaf_after, backend=CompileCounter(), fullgraph=True)(torch.ones(3, requires_grad=True), v)


class Clipped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.data = self.lin.weight.data.clamp(-0.1, 0.1)
        return self.lin(x)


def test_a_module_clamps_its_weight_through_data():
    torch.manual_seed(0)
    eager = Clipped()
    compiled_module = Clipped()
    compiled_module.load_state_dict(eager.state_dict())
    compiled = kiln.compile(compiled_module, backend=CompileCounter(), fullgraph=True)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(compiled_module.lin.weight, eager.lin.weight)
    assert isinstance(compiled_module.lin.weight, torch.nn.Parameter)
