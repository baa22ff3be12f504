"""NumPy in the compiled frame, traced through torch as torch.compile does: ndarray arguments and
results, np.* functions, methods, operators and attributes in one graph; results compared with eager
NumPy (values, dtype, and array-vs-scalar)."""
import numpy as np
import pytest
import torch

import kiln
from tests.utils import CompileCounter


def same_numpy(actual, expected):
    """Equal values of the same kind: ndarray vs NumPy scalar vs tensor, dtype included."""
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            same_numpy(a, e)
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert type(actual) is type(expected), (type(actual), type(expected))
        assert actual.dtype == expected.dtype and np.shape(actual) == np.shape(expected)
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
    else:
        assert actual == expected


def run_compiled(fn, *args, graphs=1):
    counter = CompileCounter()
    expected = fn(*args)
    actual = kiln.compile(fn, backend=counter, fullgraph=True)(*args)
    same_numpy(actual, expected)
    assert counter.frame_count == graphs
    return actual


def reductions_of_a_tensors_array(x):
    row_means = np.mean(x.numpy(), 1)
    total = np.sum(row_means)
    return torch.from_numpy(np.asarray(total)), total, row_means


def array_methods_and_attributes(x):
    a = x.numpy()
    return (a.T, a.real, a.copy(), a.reshape([1, a.size]), a.max(axis=0), a.all(axis=0), a + a, a - 1.5,
            a.shape, a.ndim, a.dtype, a.transpose(1, 0).sum())


def numpy_functions_on_tensors(x):
    return (np.ones_like(x, dtype=np.float64), np.full_like(x, 2.4, dtype=np.dtype("float")),
            np.linalg.norm(x.numpy(), axis=0), np.fft.fftshift(x.numpy()), np.exp(x.numpy()) * 2)


@pytest.mark.parametrize("fn", [reductions_of_a_tensors_array, array_methods_and_attributes,
                                numpy_functions_on_tensors])
def test_numpy_on_tensors_one_graph(fn):
    run_compiled(fn, torch.randn(4, 5))


def arrays_in_and_out(a, b):
    c = a * 2 + np.exp(b)
    d = np.arange(6).reshape(2, 3) + a  # int64 + float64: NumPy's promotion
    return c.sum(), c, d, c.dtype, (a > 1).any()


def test_ndarray_arguments_and_results():
    run_compiled(arrays_in_and_out, np.arange(6.0).reshape(2, 3), np.ones((2, 3), dtype=np.float32))


def test_ndarray_guards_recompile_on_a_new_dtype_or_shape():
    counter = CompileCounter()
    compiled = kiln.compile(arrays_in_and_out, backend=counter, fullgraph=True)
    b = np.ones((2, 3))
    same_numpy(compiled(np.ones((2, 3)), b), arrays_in_and_out(np.ones((2, 3)), b))
    same_numpy(compiled(np.ones((2, 3), dtype=np.float32), b), arrays_in_and_out(np.ones((2, 3), dtype=np.float32), b))
    assert counter.frame_count == 2


def write_into(a, index, value):
    a[index] = value
    return a


def test_item_assignment_reaches_the_callers_array():
    arr, expected = np.array([[1, 1], [2, 2]]), np.array([[1, 1], [2, 2]])
    write_into(expected, np.s_[0, ...], np.zeros(2))
    result = kiln.compile(write_into, backend=CompileCounter(), fullgraph=True)(arr, np.s_[0, ...], np.zeros(2))
    np.testing.assert_array_equal(arr, expected)
    assert result is arr


def constants_only(x):
    return x * np.sqrt(4.0) + np.float32(1.5) + np.iinfo(np.int8).max + np.finfo(np.float32).eps


def test_numpy_on_constants_folds():
    run_compiled(constants_only, torch.randn(3))


def random_numbers(x):
    return x + np.random.rand()


def test_numpy_random_breaks_the_graph_cleanly():
    with pytest.raises(kiln.Unsupported):
        kiln.compile(random_numbers, backend=CompileCounter(), fullgraph=True)(torch.randn(2))
    np.random.seed(0)
    expected = random_numbers(torch.zeros(2))
    np.random.seed(0)
    torch.testing.assert_close(kiln.compile(random_numbers, backend=CompileCounter())(torch.zeros(2)), expected)
