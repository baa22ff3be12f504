"""Loops (unrolled) and branches on Python values and tensor metadata: one graph, eager results."""
import pytest
import torch

from tests.utils import check_graphs


def for_range(x):
    for i in range(3):
        x = x + i
    return x


def for_range_step_reversed(x):
    for i in reversed(range(0, 6, 2)):
        x = x * 0.5 + i
    return x


def for_list_of_tensors(x):
    out = x
    for t in [x, x * 2, x * 3]:
        out = out + t
    return out


def for_tuple_of_numbers(x):
    for c in (1.0, 2.0, 0.5):
        x = x * c
    return x


def for_dict_items(x):
    for name, scale in {"a": 1.0, "b": 2.0}.items():
        x = x * scale + len(name)
    return x


def for_enumerate(x):
    out = x
    for i, t in enumerate([x, x.sin()], start=1):
        out = out + i * t
    return out


def for_zip(x, y):
    out = 0
    for a, b in zip([x, y], [y, x]):
        out = out + a * b
    return out


def for_tensor_rows(x):
    acc = torch.zeros_like(x[0])
    for row in x:
        acc = acc + row
    return acc


def for_break_continue(x):
    for i in range(10):
        if i == 1:
            continue
        if i > 3:
            break
        x = x + i
    return x


def for_else(x):
    for i in range(2):
        x = x + i
    else:
        x = x * 10
    return x


def nested_loops(x):
    for i in range(2):
        for j in range(3):
            x = x + i * j
    return x


def while_python_counter(x):
    i = 0
    while i < 4:
        x = x * 1.5
        i += 1
    return x


def while_on_shape(x):
    while x.shape[0] > 1:
        x = x[: x.shape[0] // 2] + x[x.shape[0] // 2:]
    return x


def if_on_constant(x):
    debug = False
    if debug:
        return x - 100
    return x + 100


def if_on_shape(x):
    if x.shape[-1] == 4:
        return x.sum(-1)
    return x.sum(0)


def if_on_dtype(x):
    if x.dtype == torch.float32:
        return x.double() * 2
    return x.float()


def if_on_ndim(x):
    if x.ndim > 1:
        return x.flatten()
    return x


def if_on_dim_and_numel(x):
    return x * 2 if x.dim() == 2 and x.numel() == 12 else x


def if_on_device(x):
    if x.device.type == "cpu":
        return x + 1
    return x - 1


def if_on_requires_grad(x):
    if x.requires_grad:
        return x * 3
    return x * 4


def if_on_is_floating_point(x):
    return x.sin() if x.is_floating_point() else x


def if_on_size_call(x):
    b, n = x.size()
    return x.reshape(n, b) if b != n else x


def if_on_is_contiguous(x):
    return x + 1 if x.is_contiguous() else x.contiguous()


CASES = [for_range, for_range_step_reversed, for_list_of_tensors, for_tuple_of_numbers, for_dict_items,
         for_enumerate, for_tensor_rows, for_break_continue, for_else, nested_loops, while_python_counter,
         while_on_shape, if_on_constant, if_on_shape, if_on_dtype, if_on_ndim, if_on_dim_and_numel,
         if_on_device, if_on_requires_grad, if_on_is_floating_point, if_on_size_call, if_on_is_contiguous]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_control_flow_one_graph(fn):
    check_graphs(fn, torch.randn(3, 4), graphs=1)


def test_for_zip_one_graph():
    check_graphs(for_zip, torch.randn(3), torch.randn(3), graphs=1)


@pytest.mark.parametrize("shape", [(3, 4), (4, 5), (6,)])
def test_branch_on_shape_each_shape_correct(shape):
    check_graphs(if_on_shape, torch.randn(*shape), graphs=1)


def test_branch_on_requires_grad_true():
    x = torch.randn(3, requires_grad=True)
    check_graphs(if_on_requires_grad, x, graphs=1)


def test_branch_on_dtype_int():
    check_graphs(if_on_dtype, torch.arange(6), graphs=1)
