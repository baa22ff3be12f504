"""Grad-mode blocks (no_grad, enable_grad, set_grad_enabled) across graph breaks and in graphs that
start without grad: results, requires_grad and the grad mode after the call, as eager."""

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs


@kiln.disable
def opaque():
    """A call capture does not follow: the graph breaks here."""


def enable_grad_block(a, b):
    x = a + 1
    with torch.enable_grad():
        x = x * b
        inside = torch.is_grad_enabled()
    return x + 2, inside


def test_enable_grad_in_a_graph_called_without_grad_is_one_graph():
    """Switching grad on alone changes no value when no tensor in the block needs grad."""
    with torch.no_grad():
        counter = check_graphs(enable_grad_block, torch.randn(3), torch.randn(3), graphs=1)
    assert counter.op_count == 5  # add, grad on, mul, grad off, add
    assert torch.is_grad_enabled()


def makes_a_leaf_inside(a):
    with torch.enable_grad():
        w = torch.ones(3, requires_grad=True)
        y = (a * w).sum()
    return y, y.requires_grad, w.requires_grad


def test_a_tensor_needing_grad_made_in_enable_grad_keeps_its_grad_fn():
    with torch.no_grad():
        compiled = kiln.compile(makes_a_leaf_inside, backend=CompileCounter())
        expected, actual = makes_a_leaf_inside(torch.arange(3.0)), compiled(torch.arange(3.0))
    assert actual[1:] == expected[1:] == (True, True)
    assert actual[0].grad_fn is not None
    torch.testing.assert_close(actual[0], expected[0])


def test_input_needing_grad_used_in_enable_grad_under_no_grad():
    with torch.no_grad():
        x = torch.randn(3, requires_grad=True)
        check_graphs(enable_grad_block, torch.randn(3), x)


def nested_blocks_with_breaks(x):
    before = torch.is_grad_enabled()
    with torch.set_grad_enabled(False):
        opaque()
        with torch.set_grad_enabled(True):
            x = torch.mul(x, 5)
            opaque()
            x = torch.sqrt(x.abs())
            inner = torch.is_grad_enabled()
        outer = torch.is_grad_enabled()
    return x, inner, outer, torch.is_grad_enabled() == before


@pytest.mark.parametrize("requires_grad", [False, True])
def test_breaks_in_nested_grad_mode_blocks_compile_each_part(requires_grad):
    counter = check_graphs(nested_blocks_with_breaks, torch.randn(3, 4, requires_grad=requires_grad))
    if not requires_grad:  # (with it, kiln's mul makes a tensor needing grad in a graph begun without)
        assert counter.frame_count == 2  # mul (before the second break), sqrt (after it)
    assert torch.is_grad_enabled()


def raises_in_a_block_after_a_break(x, fail):
    with torch.no_grad():
        opaque()
        with torch.enable_grad():
            y = x * 2
            opaque()
            if fail:
                raise ValueError("inside")
            y = y + 1
    return y


def test_an_exception_leaving_a_resumed_block_restores_grad_mode():
    compiled = kiln.compile(raises_in_a_block_after_a_break, backend=CompileCounter())
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(compiled(x, False), raises_in_a_block_after_a_break(x, False))
    with torch.no_grad():
        with pytest.raises(ValueError, match="inside"):
            compiled(x, True)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def mode_object_made_before_a_break(x):
    x = x + 1
    ctx = torch.set_grad_enabled(False)
    made = torch.is_grad_enabled()
    opaque()
    with ctx:
        x = x * 2
        inside = torch.is_grad_enabled()
    return x, made, inside, ctx.prev, ctx.mode


def no_grad_object_entered_before_a_break(x):
    ctx = torch.no_grad()
    with ctx:
        y = x * 2
    opaque()
    with ctx:
        z = y + x
    return z, ctx.prev


@pytest.mark.parametrize("fn", [mode_object_made_before_a_break, no_grad_object_entered_before_a_break])
def test_grad_mode_object_lives_across_a_break(fn):
    counter = check_graphs(fn, torch.randn(3, requires_grad=True))
    # (3.12+ puts a with-block's cleanup after the function and jumps back from it: no loop)
    assert counter.frame_count == 2
    assert torch.is_grad_enabled()


def made_then_entered_after_a_break(x):
    x = x + 1
    ctx = torch.set_grad_enabled(True)
    opaque()
    with ctx:
        x = x * 2
    return x


def test_a_grad_mode_object_handed_to_the_resume_function_is_not_compiled_again():
    """A new set_grad_enabled object reaches the resume function on every call: guarded by its state,
    not by which object it is, so later calls reuse the entries."""
    counter = CompileCounter()
    compiled = kiln.compile(made_then_entered_after_a_break, backend=counter)
    x = torch.zeros(3)
    for _ in range(3):
        out = compiled(x)
        torch.testing.assert_close(out, made_then_entered_after_a_break(x))
        assert out.requires_grad is False and torch.is_grad_enabled()
    assert counter.frame_count == 2


def grad_back_on_after_a_block(x, w):
    with torch.no_grad():
        a = x * w
        opaque()
        b = a * w  # (no grad: inside the block)
    return b, b * w  # the resume function's graph switches grad on here


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiling_a_graph_with_a_grad_switch_leaves_grad_mode_alone(backend):
    """Tracing the resume function's graph runs its grad switch for real; the first call (which
    compiles) must still compute `b` without grad, as every later call does."""
    compiled = kiln.compile(grad_back_on_after_a_block, backend=backend)
    w = torch.randn(3, requires_grad=True)
    for _ in range(2):
        x = torch.randn(3)
        actual, expected = compiled(x, w), grad_back_on_after_a_block(x, w)
        assert [t.requires_grad for t in actual] == [t.requires_grad for t in expected] == [False, True]
        torch.testing.assert_close(actual, expected)
