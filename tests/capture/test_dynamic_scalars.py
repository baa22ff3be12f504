"""Python ints and floats as torch.compile 2.13 treats them: a number the caller passes (an argument, the
frame's closure, an attribute or item reached through them) is folded in as a constant first and becomes a
symbolic graph input once its value changes (dynamic=None), or from the start (dynamic=True): one more
compile, not one per value. Globals and module attributes stay constants. Sizes that flow back into Python
under dynamic=True stay symbolic, and `item()` is a graph break unless capture_scalar_outputs is on.
Every count here is torch.compile's (KILN_TEST_PEER=torch runs the same tests against it)."""
import math
import os

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_calls

PEER = os.environ.get("KILN_TEST_PEER") == "torch"


def t(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + len(shape)))


def scale(x, n):
    return (x * n).sin()


def test_changing_int_argument_compiles_twice():
    check_calls(scale, [(t(4), n) for n in (2, 3, 4, 5, 7)], graphs=2)


def test_changing_float_argument_compiles_twice():
    check_calls(scale, [(t(4), a) for a in (0.5, 1.5, 2.25, -3.0)], graphs=2)


@pytest.mark.parametrize("values", [(2, 3, 4), (0, 1, 2), (0.5, 1.5, 2.5)], ids=["ints", "zero_one", "floats"])
def test_dynamic_true_numbers_are_symbolic_from_the_start(values):
    check_calls(scale, [(t(4), v) for v in values], graphs=1, dynamic=True)


def test_dynamic_false_folds_every_value():
    check_calls(scale, [(t(4), n) for n in (2, 3, 4)], graphs=3, dynamic=False)


class Config:
    def __init__(self, n):
        self.n = n


def test_numbers_reached_through_arguments():
    def attr(x, cfg):
        return x * cfg.n

    def item(x, sizes):
        return x + sizes[1]
    check_calls(attr, [(t(3), Config(n)) for n in (2, 3, 4, 5)], graphs=2)
    check_calls(item, [(t(3), [1, n]) for n in (2, 3, 4, 5)], graphs=2)


def test_closure_of_the_compiled_function():
    def make(n):
        def inner(x):
            return x * n + 1
        return inner
    counter = CompileCounter()
    for n in (2, 3, 4, 5):
        fn = make(n)
        x = t(3)
        torch.testing.assert_close(kiln.compile(fn, backend=counter)(x), fn(x))
    assert counter.frame_count == 2


LIMIT = 2


def test_global_number_stays_a_constant():
    global LIMIT

    def add_limit(x):
        return x + LIMIT
    counter = CompileCounter()
    compiled = kiln.compile(add_limit, backend=counter)
    for LIMIT in (2, 3, 4, 5):
        x = t(3)
        torch.testing.assert_close(compiled(x), add_limit(x))
    assert counter.frame_count == 4
    LIMIT = 2


def test_module_attribute_stays_a_constant():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = 2

        def forward(self, x):
            return x * self.factor
    module = Scale()
    counter = CompileCounter()
    compiled = kiln.compile(module, backend=counter)
    for factor in (2, 3, 4, 5):
        module.factor = factor
        x = t(3)
        torch.testing.assert_close(compiled(x), module(x))
    assert counter.frame_count == 4


def test_bool_argument_stays_a_constant():
    def maybe_negate(x, flag):
        return x * 2 if flag else x - 1
    check_calls(maybe_negate, [(t(3), True), (t(3), False), (t(3), True), (t(3), False)], graphs=2)


def test_int_used_as_a_size():
    def rows(x, n):
        return x.reshape(n, -1).sum(1)
    check_calls(rows, [(t(12), n) for n in (2, 3, 4, 6, 12)], graphs=2)


def test_int_in_a_python_branch_guards_the_branch():
    def branch(x, n):
        if n > 3:
            return x + n
        return x - n
    # 2 static; 3 symbolic with n <= 3; 4 fails that guard: symbolic with n > 3, which 5 and 6 reuse
    check_calls(branch, [(t(3), n) for n in (2, 3, 4, 5, 6)], graphs=3)


def test_int_returned_and_computed_with():
    def both(x, n):
        return x.sum() + n, n * 2, n // 3
    counter = check_calls(both, [(t(4), n) for n in (2, 5, 7, 11)], graphs=2)
    out = kiln.compile(both, backend=counter)(t(4), 13)
    assert type(out[1]) is int and out[1] == 26 and out[2] == 4


def test_float_nan_is_folded_in():
    def shift(x, a):
        return torch.nan_to_num(x + a, nan=0.0, posinf=1.0, neginf=-1.0)
    counter = CompileCounter()
    compiled = kiln.compile(shift, backend=counter)
    for a in (1.5, 2.5, math.inf, 3.5, math.nan, -math.inf):
        x = t(3)
        torch.testing.assert_close(compiled(x, a), shift(x, a))
    # 1.5 folded in; 2.5 symbolic (guarded not nan), which the infinities and 3.5 reuse; nan folded in
    assert counter.frame_count == 3


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_symbolic_numbers_with_training_backends(backend):
    """A number that became symbolic is read at every call, forward and backward (the compiled graph
    must not keep the value it was traced with)."""
    def fn(x, n, a):
        return (x * n + a).tanh()
    compiled = kiln.compile(fn, backend=backend)
    for n, a in ((2, 0.5), (3, 1.5), (4, 2.5), (7, -1.0)):
        for grad in (False, True):
            x = t(5)
            xe, xc = x.clone().requires_grad_(grad), x.clone().requires_grad_(grad)
            expected, actual = fn(xe, n, a), compiled(xc, n, a)
            torch.testing.assert_close(actual, expected)
            if grad:
                expected.sum().backward()
                actual.sum().backward()
                torch.testing.assert_close(xc.grad, xe.grad)


# ---- sizes flowing back into Python under dynamic=True -------------------------------------------
def halves(x):
    n = x.shape[0]
    return x.view(n // 2, 2) * 2


def size_times_three(x):
    n = x.shape[0]
    return x + 1, n * 3


def shape_of_result(x):
    y = x * 2
    return y, y.shape, x.size()


@pytest.mark.parametrize("fn", [halves, size_times_three, shape_of_result])
def test_sizes_stay_symbolic_under_dynamic_true(fn):
    check_calls(fn, [(t(8),), (t(10),), (t(12),)], graphs=1, dynamic=True)


def test_returned_shape_keeps_its_type_and_values():
    compiled = kiln.compile(shape_of_result, backend=CompileCounter(), dynamic=True)
    for rows in (8, 10):
        y, shape, size = compiled(t(rows, 3))
        assert type(shape) is torch.Size and type(size) is torch.Size
        assert shape == (rows, 3) and size == (rows, 3) and type(shape[0]) is int


def test_size_returned_after_automatic_dynamic():
    def count(x):
        return x.sum(), x.shape[0] + 1
    check_calls(count, [(t(8),), (t(10),), (t(12),)], graphs=2)


# ---- item() ------------------------------------------------------------------------------------
def scaled_by_sum(x):
    return x * x.sum().item()


def positives_and_max(x):
    n = (x > 0).sum().item()
    top = x.max().item()
    return x * n + top, n, top


def branch_on_item(x):
    if x.sum().item() > 0:
        return x + 1
    return x - 1


def test_item_is_a_graph_break_by_default():
    # the graph before the break, and after it one per value of the item (dynamic=False folds it in)
    check_calls(scaled_by_sum, [(t(4),), (-t(4),)], graphs=3, dynamic=False)


@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
def test_item_in_the_graph_with_capture_scalar_outputs(backend):
    with kiln.config.patch(capture_scalar_outputs=True):
        counter = check_calls(scaled_by_sum, [(t(4),), (-t(4),)], backend=backend)
        assert counter is None or counter.frame_count == 1
        check_calls(positives_and_max, [(t(6),), (-t(6),)], backend=backend)
        compiled = kiln.compile(positives_and_max, backend=backend or "eager")
        _, n, top = compiled(t(6))
        assert type(n) is int and type(top) is float


def test_item_returned_values_with_capture_scalar_outputs():
    with kiln.config.patch(capture_scalar_outputs=True):
        check_calls(positives_and_max, [(t(6),), (-t(6),), (t(6) + 1,)], graphs=1, dynamic=False)


def test_branch_on_item_still_breaks():
    with kiln.config.patch(capture_scalar_outputs=True):
        counter = check_calls(branch_on_item, [(t(4),), (-t(4).abs(),)], dynamic=False)
        assert counter.frame_count >= 2
        with pytest.raises(kiln.Unsupported):
            kiln.compile(branch_on_item, backend="eager", fullgraph=True)(t(4))


def test_methods_of_a_symbolic_number():
    """int and float methods on a number that became symbolic see its value (and pin it)."""
    def fn(x, n, a):
        return x * n.bit_length() + a.is_integer(), a.as_integer_ratio(), n.conjugate()
    check_calls(fn, [(t(3), 5, 0.5), (t(3), 6, 2.0), (t(3), 9, 0.25)], dynamic=True, fullgraph=True)


def test_returning_only_sizes_needs_no_graph():
    """Sizes recomputed from the inputs leave no op in the graph: no graph at all, as in torch.compile."""
    def sizes(x):
        return x.shape, x.size(1)
    check_calls(sizes, [(t(8, 3),), (t(10, 3),), (t(12, 5),)], graphs=0)
