"""A graph that raises when it runs (an error its fake run did not see): the frame runs again
eagerly from its start where that cannot be told from one run (rerun.py), so the error, the side
effects before it and a `try` around it behave as in eager. torch.compile raises from its graph
there, losing the writes before the failing op and skipping the program's own `except`."""
import pytest
import torch

import kiln
from tests.utils import CompileCounter

W = torch.randn(3, 3)  # float32: a float64 operand makes matmul raise, which fake tensors do not check


class Box:
    pass


def outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 -- the error is part of the answer
        return None, (type(e), str(e))


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_writes_before_a_failing_op_happen_as_in_eager(backend):
    def program(box, log, x):
        y = x + 1
        box.n = y.shape[0]
        log.append(len(log))
        return y.double() @ W

    eager_box, eager_log, box, log = Box(), [], Box(), []
    compiled = kiln.compile(program, backend=backend)
    for n in (2, 2, 4):
        x = torch.randn(n, 3)
        expected, expected_error = outcome(program, eager_box, eager_log, x)
        got, error = outcome(compiled, box, log, x)
        assert expected is None and error == expected_error
        assert vars(box) == vars(eager_box) and log == eager_log


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_try_around_an_op_that_fails_when_the_graph_runs_catches_it(backend):
    def program(x):
        try:
            y = x.double() @ W
        except RuntimeError:
            y = x @ W
        return y + 1

    x = torch.randn(2, 3)
    torch.testing.assert_close(kiln.compile(program, backend=backend)(x), program(x))


def test_a_graph_that_wrote_an_input_before_it_raised_is_not_run_twice():
    """The graph's write is kept once; the error is the graph's (the side effect after the write is
    lost, as under torch.compile: running the frame again would write the input twice)."""
    def program(x, box):
        x.add_(1)
        box.n = 1
        return x.double() @ W

    x = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="same dtype"):
        kiln.compile(program, backend="eager")(x, Box())
    assert torch.equal(x, torch.ones(2, 3))


def test_a_graph_that_drew_random_numbers_before_it_raised_is_not_run_twice():
    def program(x):
        noise = torch.rand(3)
        return (x + noise).double() @ W

    torch.manual_seed(0)
    with pytest.raises(RuntimeError):
        program(torch.zeros(2, 3))
    expected = torch.rand(1)
    torch.manual_seed(0)
    with pytest.raises(RuntimeError):
        kiln.compile(program, backend="eager")(torch.zeros(2, 3))
    assert torch.equal(torch.rand(1), expected)  # the generator advanced once, as in eager


def test_the_rerun_keeps_the_compiled_entry():
    """A call that raises reruns eagerly; later calls that do not raise use the same graph."""
    counter = CompileCounter()

    def program(x, w):
        return (x @ w).relu()

    compiled = kiln.compile(program, backend=counter)
    with pytest.raises(RuntimeError):
        compiled(torch.randn(2, 3), W.double())  # (a dtype guard: this one compiles its own graph)
    x = torch.randn(2, 3)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, W), program(x, W))
    assert counter.frame_count == 2


def test_arguments_of_every_kind_reach_the_rerun():
    seen = []

    def program(a, /, b, *rest, c, **extra):
        out = a + b + sum(rest) + c + sum(extra.values())
        seen.append((a.sum().item(), b.sum().item(), rest, c, extra))
        return out.double() @ W

    args, kwargs = (torch.ones(2, 3), torch.full((2, 3), 2.0), 1.0, 2.0), {"c": 3.0, "d": 4.0}
    expected_error = outcome(program, *args, **kwargs)
    expected_seen = seen.pop()
    assert outcome(kiln.compile(program, backend="eager"), *args, **kwargs) == expected_error
    assert seen == [expected_seen]
