"""The acceptance tests can fail: the shared checks catch a wrong result, a missed input mutation,
wrong Python state and a wrong graph count."""
import pytest
import torch

from tests.utils import assert_equal_state, assert_same


def mutates(x, out):
    x.add_(1)
    out.append(x.sum())
    return x * 2


def test_wrong_result_is_caught():
    with pytest.raises(AssertionError):
        assert_same(mutates, lambda x, out: mutates(x, out) + 1e-3, torch.zeros(3), [])


def test_missed_input_mutation_is_caught():
    def forgets_mutation(x, out):
        out.append(x.sum() + 3)
        return (x + 1) * 2
    with pytest.raises(AssertionError):
        assert_same(mutates, forgets_mutation, torch.zeros(3), [])


def test_missed_python_side_effect_is_caught():
    def forgets_append(x, out):
        x.add_(1)
        return x * 2
    with pytest.raises(AssertionError):
        assert_same(mutates, forgets_append, torch.zeros(3), [])


@pytest.mark.parametrize("actual, expected", [
    ({"a": torch.ones(2)}, {"a": torch.zeros(2)}),
    ((1, torch.ones(1)), [1, torch.ones(1)]),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
])
def test_state_differences_are_caught(actual, expected):
    with pytest.raises(AssertionError):
        assert_equal_state(actual, expected)
