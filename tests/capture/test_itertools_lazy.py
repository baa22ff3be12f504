"""itertools iterators made in the frame step lazily, as CPython's do (infinite ones included, and a
predicate runs only for the items consumed), and one returned from the frame comes back as the same
itertools object in the same state. Each runs eagerly and compiled (one graph, fullgraph=True)."""
import itertools

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs


def consumed_lazily(x):
    return (x + 1, list(zip(range(3), filter(lambda y: y < 10, itertools.count()))),
            list(map(lambda p, q: p + q, [x, x], itertools.count(3))),
            list(itertools.compress("ABCDEF", [1, 0, 1, 0, 1, 1])),
            [t * 2 for t in itertools.compress([x, x + 1, x + 2], [1, 0, 1])],
            list(itertools.filterfalse(lambda v: v > 0, [-0.5, 0, 0.5])),
            list(itertools.takewhile(lambda v: v < 3, [1, 2, 3, 1])),
            list(itertools.dropwhile(lambda v: v < 3, [1, 2, 3, 1])),
            list(itertools.starmap(torch.add, [(x, 1), (x, 2)])),
            list(itertools.islice(range(100), 10, 20, 3)), list(itertools.islice(range(10), None)),
            list(itertools.islice(itertools.count(), 3, 8)), list(itertools.islice([x, x * 2, x * 3], 1, None)),
            [x * v for v in itertools.repeat(object=2, times=3)], next(itertools.count(start=1, step=2)))


SEEN = []


def predicate_runs_per_item(x):
    def small(v):
        SEEN.append(v)
        return v < 2

    taken = itertools.takewhile(small, [0, 1, 5, 0, 0])
    return x * sum(taken)  # takewhile stops at 5: the zeros after it are never tested


def test_consumed_lazily_one_graph():
    check_graphs(consumed_lazily, torch.randn(3), graphs=1, fullgraph=True)


def test_predicates_run_only_for_consumed_items():
    SEEN.clear()
    x = torch.randn(2)
    check_graphs(predicate_runs_per_item, x, graphs=1, fullgraph=True)
    assert SEEN == [0, 1, 5] * 2  # eager's calls, then the compiled call's (its appends replayed)


def returned_part_way(x):
    a = itertools.islice(itertools.count(), 2, 20, 4)
    b = itertools.dropwhile(lambda v: v < 3, [1, 2, 3, 1, 5])
    c = itertools.takewhile(lambda v: v < 3, [1, 2, 3, 1])
    d = itertools.compress(iter([x, x + 1, x + 2, x + 3]), [1, 0, 1, 1])
    e, f, g = itertools.repeat(1), itertools.count(2), itertools.repeat(x, 5)
    for _ in range(3):
        x = x + next(e) + next(f) + next(g)
    next(a), next(b), next(c), next(c), next(d)
    return x, a, b, c, d, e, f, g


def test_returned_iterators_keep_their_kind_and_state():
    x = torch.randn(3)
    expected = returned_part_way(x)
    actual = kiln.compile(returned_part_way, backend=CompileCounter(), fullgraph=True)(x)
    torch.testing.assert_close(actual[0], expected[0])
    for got, want in zip(actual[1:], expected[1:]):
        assert type(got) is type(want)
        got, want = list(itertools.islice(got, 6)), list(itertools.islice(want, 6))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("bad", [lambda: itertools.islice(range(3), -1), lambda: itertools.repeat(1, "2"),
                                 lambda: itertools.count("a")])
def test_bad_arguments_raise_as_in_python(bad):
    def fn(x):
        try:
            bad()
        except (TypeError, ValueError) as e:
            return x + 1, type(e).__name__
        return x, "none"

    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


# ---- tee: iterators sharing one buffer ----------------------------------------------------------
def tees_share_a_buffer(x):
    first, second, third = itertools.tee(iter([x, x * 2, x * 3, x * 4]), 3)
    ahead = next(first) + next(first)
    behind = next(second)
    same, = itertools.tee(second, 1)  # (CPython hands the tee iterator itself back, then copies)
    copy_of, other = itertools.tee(second)
    mixed = next(same) + next(second) + next(other)
    long_a, long_b = itertools.tee(iter(range(3000)))
    return (ahead, behind, mixed, same is second, copy_of is second, list(third), list(other),
            sum(long_a), next(long_b), x + 1)


def tee_arguments_checked(x):
    try:
        itertools.tee([1], -1)
    except ValueError as e:
        return x - 1, str(e), itertools.tee([x], 0)
    return x, "", ()


@pytest.mark.torch_differs("torch.compile 2.13 refuses tee of an iterator and misses tee's check of n")
@pytest.mark.parametrize("fn", [tees_share_a_buffer, tee_arguments_checked])
def test_tee_iterators_share_one_buffer_one_graph(fn):
    # (before: "call to builtin_function_or_method tee (not Python code kiln can follow)")
    check_graphs(fn, torch.randn(3), graphs=1, fullgraph=True)


def tee_left_part_way(x):
    a, b = itertools.tee(v * 2 for v in [1, 2, 3, 4, 5])
    next(a), next(a), next(b)
    return x + 1, a, b


@pytest.mark.torch_differs("torch.compile 2.13 refuses a generator expression's tee (uninitialized cell)")
def test_tee_iterators_returned_part_way_share_their_buffer():
    x = torch.randn(3)
    _, a, b = kiln.compile(tee_left_part_way, backend=CompileCounter(), fullgraph=True)(x)
    _, ea, eb = tee_left_part_way(x)
    assert type(a) is type(ea)
    assert (next(b), list(a), list(b)) == (next(eb), list(ea), list(eb))
