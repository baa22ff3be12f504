"""Functions the program makes anew on every call (closures from a factory, lambdas, nested defs passed
on): guarded by their code, globals and what their cells and defaults hold, not by which object they
are, so an equal new closure reuses the graph while a closure over a new value is never stale."""
import pytest
import torch

import kiln
from tests.capture.test_side_effects import make_cell_writer
from tests.utils import CompileCounter, assert_equal_state


def scaler(k):
    def scale(y):
        return y * k
    return scale


def shifter(k):
    return lambda y, k=k: y + k


def apply_twice(x, fn):
    return fn(fn(x)).cos()


def run_calls(fn, make_args, n):
    """fn eagerly and compiled, on args made afresh per call by make_args(i) for each side: results and
    arguments afterwards equal; returns the counter."""
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter)
    for i in range(n):
        eager_args, compiled_args = make_args(i), make_args(i)
        assert_equal_state(compiled(*compiled_args), fn(*eager_args))
        assert_equal_state(compiled_args, eager_args)
    return counter


def test_a_new_closure_over_equal_values_reuses_the_graph():
    x = torch.randn(4)
    counter = run_calls(apply_twice, lambda i: (x, scaler(3.0)), 4)
    assert counter.frame_count == 1  # (was one graph per call: the closure's identity was guarded)


def test_a_closure_over_a_new_number_gives_the_new_answer():
    x = torch.randn(4)
    counter = run_calls(apply_twice, lambda i: (x, scaler(i + 2)), 4)
    assert counter.frame_count == 2  # the cell's int changed: it becomes an input, as torch.compile does


def test_a_closure_over_a_new_tensor_reads_it_as_an_input():
    counter = run_calls(apply_twice, lambda i: (torch.arange(4.0) * i, scaler(torch.full((4,), float(i)))), 4)
    assert counter.frame_count == 1


def test_a_new_lambda_with_defaults():
    x = torch.randn(4)
    assert run_calls(apply_twice, lambda i: (x, shifter(1.5)), 3).frame_count == 1
    # an int default is configuration (specialized, as torch.compile does); a float one becomes an input
    assert run_calls(apply_twice, lambda i: (x, shifter(i + 2)), 3).frame_count == 3
    assert run_calls(apply_twice, lambda i: (x, shifter(i + 2.5)), 3).frame_count <= 2


def test_closures_of_other_code_recompile():
    x = torch.randn(4)
    counter = run_calls(apply_twice, lambda i: (x, scaler(2.0) if i % 2 else shifter(2.0)), 4)
    assert counter.frame_count == 2


def test_a_nested_function_called_after_a_graph_break_in_its_maker():
    def outer(x):
        k = x.shape[0]

        def inner(y):
            return y.sin() * k
        print("between graphs")
        return inner(x) + 1

    counter = run_calls(outer, lambda i: (torch.arange(3.0) + i,), 4)
    assert counter.frame_count == 1  # (was one per call: the resumed frame recompiled each time)


def test_a_new_closure_that_writes_its_cell():
    def fn(x, step):
        return step(x) + step(x)

    x = torch.randn(3)
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter)
    for _ in range(3):
        (eager_step, eager_calls), (compiled_step, compiled_calls) = make_cell_writer(), make_cell_writer()
        assert_equal_state(compiled(x, compiled_step), fn(x, eager_step))
        assert compiled_calls() == eager_calls() == 2  # the writes land in this call's cell
    assert counter.frame_count == 1


@pytest.mark.torch_differs("guards each closure by its code only: the same object twice gets the answer "
                           "compiled for two objects")
def test_identity_of_two_closures_of_one_code_is_guarded():
    def fn(x, a, b):
        return a(x) if a is b else b(x) - 1

    x = torch.randn(3)
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter)
    first, second, same = scaler(2.0), scaler(2.0), scaler(2.0)
    assert_equal_state(compiled(x, first, second), fn(x, first, second))
    assert_equal_state(compiled(x, same, same), fn(x, same, same))  # not the answer for two objects
    assert_equal_state(compiled(x, scaler(2.0), scaler(2.0)), fn(x, first, second))


def test_what_depends_on_the_object_itself_guards_it():
    def fn(x, f):
        return f(x) if f.__name__ == "scale" else -f(x)

    def named(name):
        f = scaler(2.0)
        f.__name__ = name
        return f

    x = torch.randn(3)
    for names in (["scale", "other", "scale"], ["other", "scale"]):
        compiled = kiln.compile(fn, backend="eager")
        for name in names:
            assert_equal_state(compiled(x, named(name)), fn(x, named(name)))
