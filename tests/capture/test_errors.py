"""Errors inside the region: eager's exception type, and every side effect made before the error
(list appends, attribute sets, input mutations) is visible afterwards, exactly as in eager."""
import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_equal_state, clone_args


def raise_same(fn, *args, error):
    """Run fn eagerly and compiled on equal copies; both must raise `error` and leave equal state."""
    eager_args, compiled_args = clone_args(args), clone_args(args)
    with pytest.raises(error):
        fn(*eager_args)
    with pytest.raises(error):
        kiln.compile(fn, backend=CompileCounter())(*compiled_args)
    for e, c in zip(eager_args, compiled_args):
        assert_equal_state(c, e)


class Box:
    def __init__(self):
        self.value = None


def appends_then_raises(x, log):
    log.append(x * 2)
    log.append("second")
    raise ValueError("after appends")


def sets_attribute_then_raises(x, box):
    box.value = x.sum()
    box.extra = 1
    raise KeyError("after setattr")


def mutates_input_then_raises(x):
    x.mul_(3)
    y = x + 1
    raise RuntimeError(f"after mutation {y.shape[0]}")


def negative_step_slice(x):
    return x[::-1]


def bad_dim(x):
    return x.sum(dim=5)


def bad_reshape(x):
    return x.view(7, -1)


def test_appends_before_error_visible():
    raise_same(appends_then_raises, torch.randn(3), [], error=ValueError)


def test_attribute_set_before_error_visible():
    raise_same(sets_attribute_then_raises, torch.randn(3), Box(), error=KeyError)


def test_input_mutation_before_error_visible():
    raise_same(mutates_input_then_raises, torch.randn(3), error=RuntimeError)


@pytest.mark.parametrize("fn, error", [
    pytest.param(negative_step_slice, ValueError, id="negative_step_slice",
                 marks=pytest.mark.torch_differs("raises TorchRuntimeError, not eager's ValueError")),
    pytest.param(bad_dim, IndexError, id="bad_dim"),
    pytest.param(bad_reshape, RuntimeError, id="bad_reshape"),
])
def test_tensor_errors_have_eager_type(fn, error):
    raise_same(fn, torch.randn(4, 3), error=error)


def test_error_then_success_on_the_same_compiled_function():
    def f(x, fail):
        if fail:
            raise ValueError("asked to fail")
        return x * 2
    compiled = kiln.compile(f, backend=CompileCounter())
    with pytest.raises(ValueError):
        compiled(torch.ones(2), True)
    torch.testing.assert_close(compiled(torch.ones(2), False), torch.full((2,), 2.0))


@kiln.disable
def refuses(t):
    raise ValueError("refused outside the graph")


def side_effects_then_breaking_error(x, log):
    log.append(x + 1)
    x.add_(5)
    refuses(x)
    log.append("never")


def test_breaking_call_that_raises_sees_prior_side_effects():
    raise_same(side_effects_then_breaking_error, torch.zeros(3), [], error=ValueError)


def test_break_construct_sees_input_mutated_before_it(capsys):
    def f(x):
        x.add_(1)
        print(x.tolist())
        return x * 2
    compiled = kiln.compile(f, backend=CompileCounter())
    compiled(torch.zeros(2))
    assert capsys.readouterr().out == "[1.0, 1.0]\n"
