"""Python's scalar types where torch takes a dtype (`torch.zeros(n, dtype=int)` in HF Llama-4's chunked
mask, `x.to(float)`): torch reads int/float/bool/complex as int64/float64/bool/complex128, so they are
graph arguments like any dtype, not a "Python function" that breaks the graph."""
import sys

import pytest
import torch

import kiln
from tests.utils import assert_same, check_calls, check_graphs


def factories_and_conversions(x):
    n = x.shape[0]
    return (torch.zeros(n, dtype=int) + torch.arange(n), x.to(float) * 2, x.new_ones(3, dtype=bool),
            torch.full((2,), 1.5, dtype=float), x.double().view(int)[:1])


def test_python_scalar_types_as_dtypes_are_one_graph():
    check_graphs(factories_and_conversions, torch.randn(5), graphs=1, fullgraph=True)


def test_python_scalar_types_as_dtypes_through_the_default_backend():
    x = torch.randn(6)
    assert_same(factories_and_conversions, kiln.compile(factories_and_conversions, fullgraph=True), x)


@pytest.mark.torch_differs("torch.compile cannot put `complex` into its graph and breaks")
def test_complex_as_a_dtype_is_one_graph():
    check_graphs(lambda x: (x.sum(dtype=complex), x.to(complex) * 1j), torch.randn(4), graphs=1, fullgraph=True)


def type_not_a_dtype(x):
    return x.type(float)  # Tensor.type takes a dtype or a tensor type's name, not float: eager raises


@pytest.mark.torch_differs("torch.compile returns a float64 tensor where eager raises")
def test_a_python_type_where_torch_takes_no_dtype_raises_as_in_eager():
    check_calls(type_not_a_dtype, [(torch.randn(3),)])


@pytest.mark.parametrize("dynamic", [False, True])
def test_dtype_int_with_a_size_from_the_input(dynamic):
    def f(x):
        left = torch.zeros(x.shape[0], device=x.device, dtype=int)
        return (x.cumsum(-1) == left[:, None]).sum(-1)
    check_calls(f, [(torch.randint(0, 2, (2, 5)),), (torch.randint(0, 2, (3, 7)),)], graphs=1 if dynamic else 2, fullgraph=True,
                dynamic=dynamic)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="3.13 no longer chains @classmethod over @property")
def test_unhashable_values_next_to_tensor_ops_are_not_taken_for_types():
    """A slice (unhashable on 3.11) indexing a tensor, and a callable unhashable object passed to a
    Python function, were looked up among the Python scalar types: TypeError inside capture
    (test_repros' test_issue134451: a slice made by an IntEnum class property)."""
    import dataclasses
    import enum

    @dataclasses.dataclass
    class Scale:  # eq=True without frozen: unhashable, and callable
        k: float

        def __call__(self, t):
            return t * self.k

    class Index(enum.IntEnum):
        X = 0
        Y = 1

        @classmethod
        @property
        def point(cls):
            return slice(cls.X, cls.Y + 1)

    def f(x, scale):
        x = x * 1
        x[..., Index.point] = scale(x[..., Index.point].tanh())
        return x

    x = torch.randn(3, 5)
    torch.testing.assert_close(kiln.compile(f, fullgraph=True)(x, Scale(2.0)), f(x, Scale(2.0)))
