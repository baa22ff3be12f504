"""The generator protocol as CPython runs it, over generators made during capture: send(), throw(),
close() (through `yield from` too), `in`, StopIteration carrying the return value, the close CPython
does when a frame drops a suspended generator, list.extend(generator) growing as it yields; and the
raise statements around them (`raise ... from`, bare `raise`). Each runs eagerly and compiled."""
import collections

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs


def t(*shape):
    return torch.randn(*shape)


def _accumulate(t, log):
    total = t
    try:
        while True:
            got = yield total
            if got is None:
                break
            total = total + got
    except ValueError:
        log.append("ValueError")
        yield total * 10
    finally:
        log.append("finally")
    return 7


def send_throw_close(x, log):
    g = _accumulate(x, log)
    a = next(g)
    b = g.send(x * 2)
    c = g.throw(ValueError)
    g.close()
    return a, b, c


def _inner(t, log):
    try:
        yield t + 1
        yield t + 2
    finally:
        log.append("inner closed")
    return 3


def _outer(t, log):
    r = yield from _inner(t, log)
    yield t * r


def yield_from_delegation(x, log):
    g = _outer(x, log)
    first = next(g)
    g.close()  # closes the sub-generator first
    h = _outer(x, log)
    values = [next(h), next(h), next(h)]  # the third is t * (the sub-generator's return value)
    k = _outer(x, log)
    next(k)
    try:
        k.throw(KeyError("k"))  # raised in the sub-generator, not caught there: comes out here
    except KeyError:
        values.append(x - 1)
    return first, values


def _catching_inner(t, log):
    try:
        yield t + 1
    except KeyError:
        log.append("inner caught")
        return t * 3  # ends the `yield from` with this value: the outer generator goes on
    return t


def _catching_outer(t, log):
    r = yield from _catching_inner(t, log)
    log.append("outer resumed")
    yield r - 1


def throw_into_yield_from_that_returns(x, log):
    g = _catching_outer(x, log)
    first = next(g)
    after_throw = g.throw(KeyError("k"))  # the sub-generator returns: the outer's next yield
    return first, after_throw


def _over_a_list(t, log):
    try:
        yield from [t + 1, t + 2]  # a list iterator has no throw(): the exception comes out of the yield
    except KeyError:
        log.append("caught in the delegating generator")
        yield t * 10


def throw_into_yield_from_a_list(x, log):
    g = _over_a_list(x, log)
    first = next(g)
    caught = g.throw(KeyError("k"))
    return first, caught, list(g)


def _counts():
    yield 1
    yield 2
    return 5


def stop_iteration_value_and_in(x):
    g = _counts()
    found = 1 in g  # consumes up to the first match
    second = next(g)
    try:
        next(g)
    except StopIteration as e:
        returned = e.value
    try:
        next(g)
    except StopIteration as e:
        again = e.value  # only the call that finished it carries the value
    return x + returned, found, second, again


def _logged(t, log):
    try:
        yield t + 1
        yield t + 2
    finally:
        log.append(len(log))


def _helper(t, log):
    return next(_logged(t, log))


def dropped_generators_are_closed(x, log):
    a = _helper(x, log)  # its generator is closed as the helper returns
    log.append(100)
    g = _logged(x, log)
    b = next(g)
    unstarted = _logged(x, log)  # never started: nothing runs  # noqa: F841
    log.append(list(log))
    return a + b


def extend_with_a_generator(x):
    y = [1]
    y.extend(y[-1] + z for z in range(3))  # each item sees the ones added before it
    d = collections.deque([1])
    d.extendleft(d[0] + z for z in range(3))
    return x + 1, y, list(d)


def raise_from_and_bare_raise(x):
    try:
        try:
            raise ValueError("a")
        except ValueError as e:
            raise KeyError("b") from e
    except KeyError as e2:
        r = (x + 1, type(e2.__cause__).__name__, type(e2.__context__).__name__)
    try:
        try:
            raise ValueError("c")
        except ValueError:
            x = x * 2
            raise
    except ValueError as e3:
        r = r + (x, str(e3))
    return r


@pytest.mark.parametrize("fn", [send_throw_close, yield_from_delegation, throw_into_yield_from_that_returns,
                                throw_into_yield_from_a_list, dropped_generators_are_closed])
def test_generator_protocol_with_side_effects_one_graph(fn):
    check_graphs(fn, t(3), [], graphs=1, fullgraph=True)


@pytest.mark.parametrize("fn", [stop_iteration_value_and_in, extend_with_a_generator, raise_from_and_bare_raise])
def test_one_graph(fn):
    check_graphs(fn, t(3), graphs=1, fullgraph=True)


def test_dropped_generator_closes_when_the_frame_returns():
    log = []
    kiln.compile(dropped_generators_are_closed, backend=CompileCounter(), fullgraph=True)(t(2), log)
    assert log == [0, 100, [0, 100], 3]


def test_a_closed_generator_stays_finished_across_a_break():
    def whoo(x):
        yield x.sin()

    def fn(x):
        gen = whoo(x)
        gen.close()
        return next(gen)  # StopIteration: the frame breaks here and the generator is rebuilt finished

    with pytest.raises(StopIteration):
        kiln.compile(fn, backend=CompileCounter())(t(3))


def test_assert_raises_inside_the_frame():
    import unittest

    case = unittest.TestCase()

    def fn(x):
        g = _counts()
        list(g)
        case.assertRaises(StopIteration, next, g)
        return x + 1

    check_graphs(fn, t(3), graphs=1, fullgraph=True)
