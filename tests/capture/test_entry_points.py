"""What can be handed to kiln.compile: functions, lambdas, bound methods, partials, callable objects,
modules' forward; called positionally, by keyword, with defaults omitted."""
import functools

import pytest
import torch
from torch import nn

import kiln
from tests.utils import CompileCounter


class Scaler:
    def __init__(self, k):
        self.k = k

    def method(self, x, bias=0.0):
        return x * self.k + bias

    def __call__(self, x):
        return x.sin() * self.k


def weighted(x, y, w=0.5):
    return x * w + y * (1 - w)


def compiled_with_counter(fn):
    counter = CompileCounter()
    return kiln.compile(fn, backend=counter), counter


@pytest.mark.parametrize("make", [
    lambda: (lambda x: x.relu() * 2),
    lambda: Scaler(3.0).method,
    lambda: functools.partial(weighted, y=torch.ones(3), w=0.25),
    lambda: Scaler(2.0),
    lambda: nn.Linear(3, 3).forward,
], ids=["lambda", "bound_method", "partial", "callable_object", "module_forward"])
def test_callables_one_graph(make):
    fn = make()
    compiled, counter = compiled_with_counter(fn)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 1


@pytest.mark.parametrize("call", [
    lambda f, x, y: f(x, y),
    lambda f, x, y: f(x, y, 0.1),
    lambda f, x, y: f(x, y=y, w=0.9),
    lambda f, x, y: f(y=y, x=x),
    lambda f, x, y: f(*(x, y), **{"w": 0.3}),
], ids=["positional", "all_positional", "keywords", "keywords_reordered", "star_call"])
def test_call_conventions(call):
    compiled, counter = compiled_with_counter(weighted)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(call(compiled, x, y), call(weighted, x, y))
    assert counter.frame_count == 1


def test_bound_method_sees_later_attribute_change():
    obj = Scaler(1.0)
    compiled, counter = compiled_with_counter(obj.method)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), obj.method(x))
    obj.k = 5.0
    torch.testing.assert_close(compiled(x), obj.method(x))


def test_compiled_keeps_function_metadata():
    compiled = kiln.compile(weighted, backend="eager")
    assert compiled.__name__ == "weighted" and compiled.__doc__ == weighted.__doc__


def test_decorated_with_fullgraph_and_backend():
    counter = CompileCounter()

    @kiln.compile(backend=counter, fullgraph=True)
    def f(x, y=None):
        return x * 2 if y is None else x + y
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2)
    torch.testing.assert_close(f(x, x), x + x)
    assert counter.frame_count == 2
