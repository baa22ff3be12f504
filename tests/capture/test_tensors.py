"""Tensors in the region: functions, methods, operators, subscripts/slices, views and in-place
ops on graph inputs and intermediates (mutated inputs updated after the call), shape-driven code."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from tests.utils import CompileCounter, assert_same, check_graphs


def torch_functions(x):
    return torch.cat([x, x.exp()], dim=0), torch.stack([x, x]), torch.where(x > 0, x, -x), torch.clamp(x, -0.5, 0.5)


def tensor_methods(x):
    return x.sum(dim=1, keepdim=True), x.mean(), x.softmax(-1), x.t().contiguous(), x.argmax(-1), x.max(dim=0).values


def functional_ops(x):
    return F.relu(x), F.gelu(x), F.layer_norm(x, x.shape[-1:]), F.dropout(x, p=0.5, training=False)


def factories_from_metadata(x):
    return (torch.zeros(x.shape), torch.ones_like(x), x.new_full((2,), 3.0), torch.arange(x.shape[0]),
            torch.eye(x.size(1)))


def dtype_and_device_conversions(x):
    return x.to(torch.float64), x.int(), x.to(x.device), x.type(torch.float16).float(), x.bool()


def shape_arithmetic(x):
    b, n = x.shape
    return x.view(b * n), x.reshape(-1, n // 2 if n % 2 == 0 else n), x.unsqueeze(0).expand(2, b, n), x.size(-1) * x


def subscripts_and_slices(x):
    return x[0], x[:, 1], x[1:, ::2], x[..., -1], x[None, :, None], x[[0, 1]], x[torch.tensor([1, 0])]


def chunk_split_unbind(x):
    a, b = x.chunk(2, dim=-1)
    c, *rest = x.split(1, dim=0)
    return a + b, c, len(rest), x.unbind(1)


def reductions_returning_tuples(x):
    values, indices = x.sort(dim=-1)
    top = x.topk(2, dim=-1)
    return values, indices, top.values, top.indices, x.min(dim=1)[0]


def inplace_on_intermediate(x):
    y = x * 2
    y.add_(1)
    y.mul_(3)
    y[0] = 0
    y.relu_()
    return y


def view_of_intermediate_then_inplace(x):
    y = x.clone()
    v = y[0]
    v.fill_(5)
    return y, v


def tensor_setitem_with_mask(x):
    y = x.clone()
    y[y < 0] = 0.0
    return y


def tensor_creation_from_python(x):
    return x + torch.tensor([1.0, 2.0, 3.0]), x * torch.full((3,), 2.0)


def requires_grad_ops(x):
    return (x * 2).detach(), x.sum()


def complex_indexing_assignment(x):
    y = torch.zeros(4, 3)
    y[1:3] = x[:2]
    y[:, 0] += 1
    return y


def tensor_attributes(x):
    return x.T, x.mT, x.real, x.shape[0] + x.ndim + x.dim() + x.numel() + x.element_size() * 0


def matmul_family(x):
    w = torch.ones(3, 2)
    return x @ w, torch.mm(x, w), torch.matmul(x, w), torch.einsum("ij,jk->ik", x, w), F.linear(x, w.t())


def torch_size_ops(x):
    s = x.shape
    new_shape = s[:-1] + (s[-1] // 3, 3)
    same = s == (4, 3) and s == torch.Size([4, 3]) and list(s) == [4, 3]
    return x.view(new_shape), x.view(*s[:-1], -1), same, s.numel(), len(s)


def loop_over_shape(x):
    out = []
    for i in range(x.shape[0]):
        out.append(x[i] * i)
    return torch.stack(out)


def scalar_tensor_python_mix(x):
    t = torch.tensor(2.0)
    return x * t + x.new_tensor(3.0) - torch.as_tensor([1.0, 2.0, 3.0])


CASES = [torch_size_ops, loop_over_shape, scalar_tensor_python_mix, torch_functions, tensor_methods, functional_ops,
         factories_from_metadata, dtype_and_device_conversions,
         shape_arithmetic, subscripts_and_slices, chunk_split_unbind, reductions_returning_tuples,
         inplace_on_intermediate, view_of_intermediate_then_inplace, tensor_setitem_with_mask,
         tensor_creation_from_python, requires_grad_ops, complex_indexing_assignment, tensor_attributes,
         matmul_family]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_tensor_code_one_graph(fn):
    check_graphs(fn, torch.randn(4, 3), graphs=1)


def inplace_input_add(x):
    x.add_(1)
    return x * 2


def inplace_input_slice(x):
    x[0] = 7.0
    return x.sum()


def inplace_input_view(x):
    x.view(-1)[::2].zero_()
    return x + 0


def inplace_input_transposed_view(x):
    x.t()[0].mul_(10)


def inplace_two_inputs(x, y):
    x.copy_(y)
    y.sub_(1)
    return x + y


def inplace_input_then_read(x):
    before = x.sum()
    x.mul_(2)
    return before, x.sum()


def out_argument(x, out):
    torch.add(x, 1, out=out)
    return out * 2


def input_returned_as_is(x):
    x.sin_()
    return x


def inplace_input_unsqueeze_(x):
    x.unsqueeze_(0)
    return x.shape[0] * x


@pytest.mark.parametrize("fn", [inplace_input_add, inplace_input_slice, inplace_input_view,
                                inplace_input_transposed_view, inplace_input_then_read, input_returned_as_is],
                         ids=lambda f: f.__name__)
def test_mutated_input_updated_after_call(fn):
    check_graphs(fn, torch.randn(3, 4), graphs=1)


def test_mutated_inputs_two_arguments():
    check_graphs(inplace_two_inputs, torch.randn(3), torch.randn(3), graphs=1)


def test_out_argument_written():
    check_graphs(out_argument, torch.randn(3), torch.empty(3), graphs=1)


def test_inplace_metadata_change_on_input():
    check_graphs(inplace_input_unsqueeze_, torch.randn(3), graphs=1)


def _transpose_input_mid_frame(x, w):
    y = x @ w
    x.t_()
    return x * 2, y


def _unsqueeze_input_by_function(x):
    torch.Tensor.unsqueeze_(x, 1)
    return x + 1


@pytest.mark.parametrize("fn, args, graphs, shape_after", [
    (inplace_input_unsqueeze_, (torch.randn(3),), 1, (1, 3)),
    (_transpose_input_mid_frame, (torch.randn(2, 3), torch.randn(3, 4)), 2, (3, 2)),
    (_unsqueeze_input_by_function, (torch.randn(4),), 1, (4, 1)),
], ids=["unsqueeze_", "t_ after an op", "Tensor.unsqueeze_(x)"])
def test_metadata_change_of_an_input_runs_between_graphs(fn, args, graphs, shape_after):
    """An in-place view op on an argument (x.t_(), x.unsqueeze_(0)) runs between graphs, as torch.compile
    runs it: the graph after it is compiled for the input with its new sizes; results and the input's
    shape after the call match eager."""
    input_shapes = []

    class Recording(CompileCounter):
        def __call__(self, gm, example_inputs):
            input_shapes.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
            return super().__call__(gm, example_inputs)

    counter = Recording()
    assert_same(fn, kiln.compile(fn, backend=counter), *args)
    assert counter.frame_count == graphs
    assert shape_after in input_shapes[-1] and tuple(args[0].shape) not in input_shapes[-1]


def test_returned_input_is_the_same_object():
    compiled = kiln.compile(input_returned_as_is, backend="eager")
    x = torch.randn(3)
    assert compiled(x) is x


def test_view_input_aliases_base():
    base = torch.zeros(4, 4)

    def f(v):
        v.add_(1)
        return v.sum()
    compiled = kiln.compile(f, backend="eager")
    expected_base = torch.zeros(4, 4)
    f(expected_base[1:3])
    compiled(base[1:3])
    torch.testing.assert_close(base, expected_base)


def test_requires_grad_input_backward_matches_eager():

    def f(x, w):
        return (x @ w).tanh().sum()
    compiled = kiln.compile(f, backend="eager")
    x, w = torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)
    f(x, w).backward()
    expected = w.grad.clone()
    w.grad = None
    compiled(x, w).backward()
    torch.testing.assert_close(w.grad, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_dtypes(dtype):
    def f(x):
        return (x.to(torch.float32) * 2 + 1).to(dtype), x.dtype == torch.bool
    check_graphs(f, (torch.randn(5) * 5).to(dtype), graphs=1)


def test_no_grad_region_inside():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + x, y.requires_grad
    check_graphs(f, torch.randn(3, requires_grad=True), graphs=1)


def test_enable_grad_state_read():
    def f(x):
        return x * 2 if torch.is_grad_enabled() else x * 3
    check_graphs(f, torch.randn(3), graphs=1)


def leaves_made_in_frame(x):
    w = torch.ones(3, requires_grad=True)
    b = x.new_zeros(3, requires_grad=True)
    c = (x * 2).detach().requires_grad_()
    return w, b, c, w * x + b, c.sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_new_autograd_leaves_keep_requires_grad_and_get_gradients(backend):
    x = torch.randn(3)
    compiled = kiln.compile(leaves_made_in_frame, backend=backend)
    for got, want in zip(compiled(x), leaves_made_in_frame(x)):
        torch.testing.assert_close(got, want)
        assert (got.requires_grad, got.is_leaf) == (want.requires_grad, want.is_leaf)
    w, b, c, y, s = compiled(x)
    (y.sum() + s).backward()  # the leaves made in the frame get their gradients, as eager's do
    torch.testing.assert_close((w.grad, b.grad, c.grad), (x, torch.ones(3), torch.ones(3)))


@pytest.mark.parametrize("batch_first", [True, False])
def test_lstm_state_shapes_read_during_capture(batch_first):
    """h_n and c_n's shapes come from the fakes capture made (torch 2.11's Python decomposition of lstm,
    run when an input needs grad, gave them an extra dimension: a wrong answer, not a break)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 6, num_layers=2, batch_first=batch_first)

    def fn(x):
        out, (h, c) = lstm(x)
        return out * 2, h.shape, c.shape, h.dim()

    check_graphs(fn, torch.randn(3, 5, 4, requires_grad=True), graphs=1)
