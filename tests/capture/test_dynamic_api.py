"""Dynamic shapes through the public API: dynamic=None/True/False over many batch sizes,
kiln.mark_dynamic (bounds, errors when the program forces a marked dim static), kiln.mark_static, and
KILN_LOGS=dynamic explaining specializations. Eager is the oracle; every expected compile count and
error was first checked against torch.compile 2.13 (KILN_TEST_PEER=torch runs them against it)."""
import inspect
import os

import pytest
import torch

import kiln
from tests.utils import CompileCounter

if os.environ.get("KILN_TEST_PEER") == "torch":
    import torch._dynamo
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError as SpecializedError
    mark_dynamic, mark_static = torch._dynamo.mark_dynamic, torch._dynamo.mark_static
else:
    mark_dynamic, mark_static, SpecializedError = kiln.mark_dynamic, kiln.mark_static, kiln.ConstraintViolation


def scaled_rows(x):
    return (x * 2 + 1).sum(dim=1) / x.shape[1]


def run_sizes(fn, sizes, mark=None, **compile_kwargs):
    """Call compiled `fn` on (n, 3) inputs for each n, checking eager results; returns the counter."""
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, **compile_kwargs)
    for n in sizes:
        x = torch.randn(n, 3)
        if mark:
            mark(x)
        torch.testing.assert_close(compiled(x), fn(x))
    return counter


@pytest.mark.parametrize("dynamic, compiles", [(None, 2), (True, 1), (False, 39)],
                         ids=["dynamic_none", "dynamic_true", "dynamic_false"])
def test_batch_sizes_2_to_40(dynamic, compiles):
    with kiln.config.patch(cache_size_limit=100):
        counter = run_sizes(scaled_rows, range(2, 41), dynamic=dynamic)
    assert counter.frame_count == compiles


def test_mark_dynamic_is_symbolic_from_the_first_call():
    counter = run_sizes(scaled_rows, [4, 9, 17], mark=lambda x: mark_dynamic(x, 0))
    assert counter.frame_count == 1


def test_mark_dynamic_under_dynamic_false_is_honoured():
    counter = run_sizes(scaled_rows, [4, 9, 17], mark=lambda x: mark_dynamic(x, [0]), dynamic=False)
    assert counter.frame_count == 1


def test_mark_static_pins_a_dim_under_dynamic_true():
    counter = run_sizes(scaled_rows, [4, 9, 17], mark=lambda x: mark_static(x, 0), dynamic=True)
    assert counter.frame_count == 3


def test_mark_dynamic_bounds_are_guards():
    counter = CompileCounter()
    compiled = kiln.compile(scaled_rows, backend=counter)
    for n in (5, 7, 10):  # inside [2, 10]: one entry
        x = torch.randn(n, 3)
        mark_dynamic(x, 0, min=2, max=10)
        torch.testing.assert_close(compiled(x), scaled_rows(x))
    assert counter.frame_count == 1
    x = torch.randn(20, 3)  # outside, unmarked: the bounded entry does not match, so it recompiles
    torch.testing.assert_close(compiled(x), scaled_rows(x))
    assert counter.frame_count == 2


def test_marked_size_outside_its_bounds_is_an_error():
    x = torch.randn(30, 3)
    mark_dynamic(x, 0, min=2, max=10)
    with pytest.raises(SpecializedError, match="30"):
        kiln.compile(scaled_rows, backend=CompileCounter())(x)


def branches_on_four(x):
    if x.shape[0] == 4:  # SPECIALIZES
        return x + 1
    return x - 1


def test_specializing_a_marked_dim_is_an_error_naming_the_line():
    x = torch.randn(4, 3)
    mark_dynamic(x, 0)
    with pytest.raises(SpecializedError) as info:
        kiln.compile(branches_on_four, backend=CompileCounter())(x)
    assert "x.shape[0] == 4" in str(info.value)


@pytest.mark.kiln_only
def test_specialization_error_names_dim_file_and_line():
    x = torch.randn(4, 3)
    mark_dynamic(x, 0)
    with pytest.raises(kiln.ConstraintViolation) as info:
        kiln.compile(branches_on_four, backend=CompileCounter())(x)
    assert info.value.dim == 0 and "L['x'].size()[0]" in str(info.value)
    assert f"{__file__}:{_line_of(branches_on_four, 'SPECIALIZES')}" in info.value.where


def narrows(x):
    if x.shape[0] > 4:
        return x * 2
    return x


def test_narrowing_a_bounded_marked_dim_is_an_error():
    x = torch.randn(8, 3)
    mark_dynamic(x, 0, min=2, max=40)
    with pytest.raises(SpecializedError):
        kiln.compile(narrows, backend=CompileCounter())(x)


def test_narrowing_an_unbounded_marked_dim_is_fine():
    counter = run_sizes(narrows, [8, 9, 12], mark=lambda x: mark_dynamic(x, 0))
    assert counter.frame_count == 1


def test_sizes_zero_and_one_stay_static_under_dynamic_true():
    counter = CompileCounter()
    compiled = kiln.compile(scaled_rows, backend=counter, dynamic=True)
    for n in (0, 1, 5, 6):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), scaled_rows(x))
    assert counter.frame_count == 3  # 0, 1, then one symbolic entry for 5 and 6


def loops_over_rows(x):
    out = x.new_zeros(x.shape[1:])
    for i in range(x.shape[0]):  # SPECIALIZES
        out = out + x[i] * i
    return out


def test_specializing_an_automatic_dynamic_dim_is_correct():
    counter = run_sizes(loops_over_rows, [2, 3, 4, 5])
    assert counter.frame_count == 4  # the loop pins each size, as in torch.compile


@pytest.mark.kiln_only
def test_specialization_explained_under_kiln_logs(kiln_logs, caplog):
    kiln_logs("dynamic")
    with caplog.at_level("DEBUG", logger="kiln"):
        run_sizes(loops_over_rows, [2, 3])
    text = caplog.text
    assert "dims [0] become dynamic" in text and "automatic dynamic" in text
    assert f"specialized to size 3 by guard Eq(L['x'].size()[0], 3)" in text
    assert f"{__file__}:{_line_of(loops_over_rows, 'SPECIALIZES')}" in text


@pytest.mark.kiln_only
def test_kiln_logs_says_why_a_dim_is_dynamic(kiln_logs, caplog):
    kiln_logs("dynamic")
    with caplog.at_level("DEBUG", logger="kiln"):
        run_sizes(scaled_rows, [4], mark=lambda x: mark_dynamic(x, 0, max=8))
        run_sizes(scaled_rows, [4], dynamic=True)
        run_sizes(scaled_rows, [4], mark=lambda x: mark_static(x, 0), dynamic=True)
    assert "scaled_rows: L['x'] dim 0 (size 4) is dynamic: kiln.mark_dynamic in [None, 8]" in caplog.text
    assert "L['x'] dim 0 (size 4) is dynamic: dynamic=True" in caplog.text
    assert "L['x'] dim 0 stays static: kiln.mark_static" in caplog.text


@pytest.mark.kiln_only
def test_mark_dynamic_rejects_bad_dims():
    with pytest.raises(kiln.InvalidArgument):
        kiln.mark_dynamic(torch.randn(3), 1)
    with pytest.raises(kiln.InvalidArgument):
        kiln.mark_dynamic(torch.randn(3), 0, min=5, max=2)


def _line_of(fn, marker):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_dynamic_true_keeps_parameter_and_buffer_sizes_static():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).eval()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter, dynamic=True)
    for n in (5, 6):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1
    values = [n.meta["example_value"] for n in counter.graphs[0].graph.nodes if n.op == "placeholder"]
    symbolic = [tuple(v.shape) for v in values
                if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape)]
    assert len(symbolic) == 1, symbolic  # the input only


def adds(x, y):
    return x + y


def test_guards_keep_equalities_and_size_one_broadcasting():
    counter = CompileCounter()
    compiled = kiln.compile(adds, backend=counter, dynamic=True)
    for a, b in ((5, 5), (7, 7), (9, 9), (7, 1)):  # y of size 1 broadcasts: a new entry
        x, y = torch.randn(a), torch.randn(b)
        torch.testing.assert_close(compiled(x, y), adds(x, y))
    assert counter.frame_count == 2


def rows_of_four(x):
    return x.view(-1, 4).sum(1)


def test_view_needs_divisibility_and_nothing_more():
    counter = CompileCounter()
    compiled = kiln.compile(rows_of_four, backend=counter, dynamic=True)
    for n in (8, 12, 20, 36):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), rows_of_four(x))
    assert counter.frame_count == 1
    with pytest.raises(RuntimeError):  # 6 is not divisible by 4: the guard fails, and eager's error shows
        compiled(torch.randn(6))


def fixed_view(x):
    return x.view(4, 2) * 2  # SPECIALIZES


def test_a_view_that_pins_a_marked_dim_is_an_error():
    x = torch.randn(8)
    mark_dynamic(x, 0)
    with pytest.raises(SpecializedError) as info:
        kiln.compile(fixed_view, backend=CompileCounter())(x)
    assert "x.view(4, 2)" in str(info.value)
