"""Frames capture cannot handle safely (generators, coroutines, breaks inside try/with) still give
the eager result, with the same Python state afterwards."""
import asyncio
import contextlib

import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_equal_state


def generator_function(x):
    for i in range(3):
        yield x * i


def test_generator_function_compiled_directly():
    compiled = kiln.compile(generator_function, backend=CompileCounter())
    x = torch.randn(3)
    assert_equal_state(list(compiled(x)), list(generator_function(x)))


def test_generator_consumed_inside_region():
    def f(x):
        return sum(generator_function(x)) + 1
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))


def test_generator_expression_inside_region():
    def f(x):
        return torch.stack(list(t * 2 for t in x.unbind(0)))
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.randn(3, 2)
    torch.testing.assert_close(compiled(x), f(x))


async def coroutine_function(x):
    await asyncio.sleep(0)
    return x * 2


@pytest.mark.torch_differs("raises 'Cannot generate resume function for generator, coroutine'")
def test_async_function_compiled_directly():
    compiled = kiln.compile(coroutine_function, backend=CompileCounter())
    x = torch.randn(3)
    torch.testing.assert_close(asyncio.run(compiled(x)), x * 2)


def test_try_except_around_failing_python():
    def f(x):
        try:
            value = {"a": 1}["b"]
        except KeyError:
            value = 5
        return x * value
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))


def test_break_inside_try_block(capsys):
    def f(x):
        y = x + 1
        try:
            print("inside try")
            y = y * 2
        finally:
            y = y - 1
        return y
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    assert capsys.readouterr().out == "inside try\n" * 2


def test_break_inside_with_block(capsys):
    entered = []

    @contextlib.contextmanager
    def tracker(tag):
        entered.append(("enter", tag))
        yield
        entered.append(("exit", tag))

    def f(x):
        with tracker("a"):
            y = x.sin()
            print("inside with")
            y = y.cos()
        return y
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    assert entered == [("enter", "a"), ("exit", "a")] * 2


def test_break_inside_no_grad_block_keeps_grad_mode(capsys):
    def f(x):
        with torch.no_grad():
            y = x * 2
            print("inside no_grad")
            z = y * x
        return z.requires_grad, (x * 3).requires_grad, z
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.randn(3, requires_grad=True)
    assert_equal_state(compiled(x), f(x))
    assert torch.is_grad_enabled()


def test_exception_raised_in_region_propagates():
    def f(x):
        y = x + 1
        if y.shape[0] == 3:
            raise ValueError("bad shape")
        return y
    compiled = kiln.compile(f, backend=CompileCounter())
    with pytest.raises(ValueError, match="bad shape"):
        compiled(torch.randn(3))
    torch.testing.assert_close(compiled(torch.ones(2)), torch.ones(2) + 1)
