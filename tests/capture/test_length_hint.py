"""operator.length_hint(obj, default) as CPython's PyObject_LengthHint: the items a list, tuple, range,
str or reversed iterator has left (after some next() calls, after its list shrank, once exhausted), a
class's own __length_hint__ (NotImplemented: the default; a bad value: CPython's error), in one graph."""
import operator

import torch

from tests.utils import check_graphs


class Hinted:
    def __init__(self, n):
        self.n = n

    def __length_hint__(self):
        return self.n


def iterators_part_way(x):
    items = [1, 2, 3, 4]
    it = iter(items)
    next(it)
    back = reversed(items)
    next(back)
    chars = iter("abc")
    span = iter(range(2, 9))
    next(span)
    pair = reversed((1, 2))
    return (x + 1, operator.length_hint(it), operator.length_hint(back), operator.length_hint(chars),
            operator.length_hint(span), operator.length_hint(pair, 9), operator.length_hint(iter(()), 5))


def iterators_of_a_changing_list(x):
    items = [1, 2, 3]
    it = iter(items)
    next(it)
    items.pop()
    items.pop()  # shorter than the iterator's position: nothing left
    shrunk = operator.length_hint(it)
    done = iter([1])
    next(done)
    try:
        next(done)
    except StopIteration:
        pass
    grown = [1]
    tail = iter(grown)
    next(tail)
    grown.append(2)  # a live iterator sees the append
    return x * 2, shrunk, operator.length_hint(done), operator.length_hint(tail)


def own_hints(x):
    try:
        operator.length_hint(Hinted(-1))
        negative = None
    except ValueError as e:
        negative = str(e)
    try:
        operator.length_hint(Hinted("3"))
        wrong = None
    except TypeError as e:
        wrong = str(e)
    return (x - 1, operator.length_hint(Hinted(3)), operator.length_hint(Hinted(NotImplemented), 4),
            operator.length_hint([1, 2], 7), negative, wrong)


def test_iterators_say_what_they_have_left():
    check_graphs(iterators_part_way, torch.randn(2), graphs=1, fullgraph=True)
    check_graphs(iterators_of_a_changing_list, torch.randn(2), graphs=1, fullgraph=True)


def test_a_class_hint_runs_as_cpython_calls_it():
    check_graphs(own_hints, torch.randn(2), graphs=1, fullgraph=True)
