"""Generators that leave a compiled frame paused at a yield (returned): they go on exactly as the
original would, lazily, with send/throw/close reaching the same yield inside the same try blocks, and
the frame still compiles. One live across a graph break makes the frame run eagerly, as in torch."""
import pytest
import torch

import kiln
from tests.utils import CompileCounter


def counting(t, log):
    log.append("start")
    yield t + 1
    log.append("second")
    yield t * 2
    log.append("done")


def started(t, log):
    gen = counting(t, log)
    first = next(gen)
    return gen, first


def run_both(fn, *make_args):
    """fn eagerly and compiled (fullgraph) on equal fresh arguments: (eager result, compiled result,
    eager args, compiled args)."""
    eager_args, compiled_args = make_args[0](), make_args[0]()
    compiled = kiln.compile(fn, backend=CompileCounter(), fullgraph=True)
    return fn(*eager_args), compiled(*compiled_args), eager_args, compiled_args


def test_a_returned_generator_computes_the_rest_when_asked():
    (eager_gen, eager_first), (gen, first), (t_e, log_e), (t_c, log_c) = run_both(
        started, lambda: (torch.ones(2), []))
    torch.testing.assert_close(first, eager_first)
    assert log_c == log_e == ["start"]
    t_e.add_(10)  # changed before the generator runs on: it sees the change, as in eager
    t_c.add_(10)
    rest_e, rest_c = list(eager_gen), list(gen)
    torch.testing.assert_close(rest_c, rest_e)
    assert log_c == log_e == ["start", "second", "done"]
    assert gen.__name__ == "counting"


def echo(t):
    got = yield t
    while got is not None:
        got = yield got * t


def started_echo(t):
    gen = echo(t)
    next(gen)
    return gen


def test_send_reaches_the_paused_yield():
    compiled = kiln.compile(started_echo, backend=CompileCounter(), fullgraph=True)
    t = torch.arange(3.0)
    eager_gen, gen = started_echo(t), compiled(t)
    for value in (2.0, 5.0):
        torch.testing.assert_close(gen.send(value), eager_gen.send(value))
    with pytest.raises(StopIteration):
        gen.send(None)


def guarded(t, log):
    try:
        yield t.sin()
        yield t.cos()
    except ValueError:
        log.append("handled")
        yield t.tan()
    finally:
        log.append("finally")


def started_guarded(t, log):
    gen = guarded(t, log)
    return gen, next(gen)


@pytest.mark.parametrize("how", ["throw", "close"])
def test_throw_and_close_run_the_handlers_around_the_yield(how):
    (eager_gen, _), (gen, _), (t, log_e), (_, log_c) = run_both(started_guarded, lambda: (torch.ones(2), []))
    if how == "throw":
        torch.testing.assert_close(gen.throw(ValueError), eager_gen.throw(ValueError))
    else:
        gen.close()
        eager_gen.close()
    assert log_c == log_e


def inner(t):
    yield t + 1
    yield t + 2
    return "inner done"


def outer(t, log):
    log.append((yield from inner(t)))
    yield t + 3


def started_outer(t, log):
    gen = outer(t, log)
    next(gen)
    return gen


def test_a_generator_paused_in_yield_from_delegates_on():
    eager_gen, gen, (_, log_e), (_, log_c) = run_both(started_outer, lambda: (torch.zeros(1), []))
    torch.testing.assert_close(list(gen), list(eager_gen))
    assert log_c == log_e == ["inner done"]


def with_a_counter(t):
    calls = 0

    def steps():
        nonlocal calls
        while True:
            calls += 1
            yield t * calls

    gen = steps()
    next(gen)
    return gen, lambda: calls


def test_cells_shared_with_other_closures_stay_shared():
    compiled = kiln.compile(with_a_counter, backend=CompileCounter(), fullgraph=True)
    gen, calls = compiled(torch.ones(1))
    eager_gen, eager_calls = with_a_counter(torch.ones(1))
    torch.testing.assert_close([next(gen), next(gen)], [next(eager_gen), next(eager_gen)])
    assert calls() == eager_calls() == 3


@kiln.disable
def opaque(x):
    return x


def paused_across_a_break(t):
    gen = counting(t, [])
    a = next(gen)
    t = opaque(t)
    return a + next(gen)


def test_a_generator_paused_across_a_graph_break_runs_the_frame_eagerly():
    """As torch.compile does (the resume function could take the paused generator over)."""
    counter = CompileCounter()
    compiled = kiln.compile(paused_across_a_break, backend=counter)
    torch.testing.assert_close(compiled(torch.ones(2)), paused_across_a_break(torch.ones(2)))
    assert counter.frame_count == 0
