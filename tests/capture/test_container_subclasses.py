"""User subclasses of list, tuple and dict: made in the frame (through the class, a Python __new__, or
tuple.__new__/list.__new__ directly) and passed in (read past their overrides, mutations and
attributes written back). Each runs eagerly and compiled in one graph, results and after-call state
compared."""
import collections
from typing import NamedTuple

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs


def t(*shape):
    return torch.randn(*shape)


class CheckedTuple(tuple):  # noqa: SLOT001
    def doubled_len(self):
        return len(self) * 2

    def __contains__(self, val):
        self.checked = True
        return super().__contains__(val)


class CheckedList(list):
    def doubled_len(self):
        return len(self) * 2

    def __contains__(self, val):
        self.checked = True
        return super().__contains__(val)

    def __getitem__(self, idx):  # capture's own reads and write-backs must not call this
        raise RuntimeError("not to be called")


class PlainList(list):
    def doubled_len(self):
        return len(self) * 2


class FixedTuple(tuple):  # noqa: SLOT001
    def __new__(cls, *args):
        return super().__new__(cls, [1, 2, 3])


class _Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class AddablePair(_Pair):
    def __new__(cls, a, b):
        return super().__new__(cls, a, b)

    def __add__(self, other):
        return AddablePair(self.a + other.a, self.b + other.b)


class Registry(collections.OrderedDict):
    pass


class Span(NamedTuple):  # a NamedTuple with methods of its own
    lo: torch.Tensor
    hi: torch.Tensor

    def width(self):
        return self.hi - self.lo

    @property
    def mid(self):
        return (self.lo + self.hi) / 2

    @staticmethod
    def unit():
        return 1

    @classmethod
    def label(cls):
        return cls.__name__


class ScaledSpan(Span):
    def scaled(self, k):
        return self.width() * k


def namedtuple_own_methods(lo, hi):
    s, z = Span(lo, hi), ScaledSpan(hi, lo)
    return s.width(), s.mid, s.unit(), s.label(), z.scaled(3), z.label(), Span._make([hi, lo]).width()


def tuple_subclass_passed_in(x, tup):
    y = torch.cos(x) if 3 in tup else torch.sin(x)
    return y * tup.doubled_len()


def list_subclass_passed_in_and_mutated(x, lst):
    if 3 in lst:
        x = torch.cos(x)
    lst.append(4)
    lst.tag = "seen"
    return x * lst.doubled_len()


def list_subclass_sliced(x, lst):
    lst.append(4)
    return x * lst.doubled_len() * sum(lst[1:3])


def made_in_frame(x):
    a = CheckedTuple([1, 2, 3])
    b = FixedTuple()
    c = tuple.__new__(CheckedTuple, [x * 2])
    c.attr = 3
    d = list.__new__(PlainList)
    d.append(x)
    d.attr = 4
    return (torch.cos(x) if 3 in a else x), a, b, c, c.attr, d, d.attr, type(c).__name__, type(d).__name__


def subclass_equality_and_operators(x, a, b, p, q):
    s = p + q  # AddablePair's own __add__
    return (x + 1 if a != b else x - 1), s.a, s.b, type(s).__name__


def ordered_dict_subclass_passed_in(x, d):
    if "key1" in d:
        x = x + 2
    if "key2" in d:
        x = x + 4
    return x + 8


def test_tuple_subclass_passed_in_runs_its_own_contains():
    tup = CheckedTuple([1, 2, 3])
    check_graphs(tuple_subclass_passed_in, t(4), tup, graphs=1, fullgraph=True)


def test_list_subclass_mutations_and_attributes_are_written_back():
    counter = check_graphs(list_subclass_passed_in_and_mutated, t(4), CheckedList([1, 2, 3]), graphs=1,
                           fullgraph=True)
    lst = CheckedList([1, 2, 3])
    kiln.compile(list_subclass_passed_in_and_mutated, backend=CompileCounter(), fullgraph=True)(t(4), lst)
    assert list.__len__(lst) == 4 and lst.checked and lst.tag == "seen"
    assert counter.frame_count == 1


@pytest.mark.parametrize("fn, args", [
    (list_subclass_sliced, lambda: (t(4), PlainList([1, 2, 3]))),
    (made_in_frame, lambda: (t(4),)),
    (subclass_equality_and_operators, lambda: (t(1), FixedTuple(), FixedTuple(), AddablePair(t(4), t(2, 8)),
                                              AddablePair(t(1), t(2, 1)))),
    (ordered_dict_subclass_passed_in, lambda: (torch.ones(8), Registry({"key1": torch.ones(8)}))),
    (namedtuple_own_methods, lambda: (t(3), t(3))),
])
def test_one_graph(fn, args):
    check_graphs(fn, *args(), graphs=1, fullgraph=True)


def test_a_different_subclass_instance_is_guarded():
    counter = CompileCounter()
    compiled = kiln.compile(ordered_dict_subclass_passed_in, backend=counter, fullgraph=True)
    assert compiled(torch.ones(2), Registry(key1=1))[0] == 11
    assert compiled(torch.ones(2), Registry(key2=1))[0] == 13  # other keys: recompiled
    assert counter.frame_count == 2


_INITS = []


class CountingList(list):
    def __init__(self, first, second):
        _INITS.append(1)
        super().__init__([first, second])


def rebuilt_without_running_init_again(x):
    lst = CountingList(x, x + 1)
    lst.note = "kept"
    return lst


def test_a_rebuilt_instance_does_not_run_its_init_again():
    _INITS.clear()
    out = kiln.compile(rebuilt_without_running_init_again, backend=CompileCounter(), fullgraph=True)(t(2))
    assert type(out) is CountingList and list.__len__(out) == 2 and out.note == "kept"
    assert _INITS == [1]  # the one append __init__ made, replayed; __init__ itself is not run again


def test_methodcaller_with_tensor_arguments():
    import operator
    y = t(3, 4)

    def fn(x):
        return operator.methodcaller("add", y, alpha=2.0)(x), operator.methodcaller("size", 0)(x)

    check_graphs(fn, t(3, 4), graphs=1, fullgraph=True)


class Pipeline(list):
    """A list of steps that is itself callable."""

    def __call__(self, x):
        for step in self:
            x = step(x)
        return x


class Scales(dict):
    def __call__(self, x, key):
        return x * self[key]


def run_pipeline(x, steps, more):
    steps.extend(more)  # (the list from outside changes too)
    return steps(x)


def test_a_list_subclass_with_call_is_called_like_eager():
    eager = assert_same_with_graphs(run_pipeline, torch.randn(4),
                                    lambda: Pipeline([torch.nn.ReLU(), torch.sigmoid]), lambda: Pipeline([torch.tanh]))
    assert len(eager) == 3


def scaled(x, scales):
    return scales(x, "b") + scales(x, "a")


def test_a_dict_subclass_with_call_is_called_like_eager():
    counter = CompileCounter()
    compiled = kiln.compile(scaled, backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(2), Scales(a=2.0, b=3.0)), torch.full((2,), 5.0))
    assert counter.frame_count == 1


def assert_same_with_graphs(fn, x, make_steps, make_more):
    """fn compiled in one graph vs eager on fresh step lists; returns the eager steps after the call."""
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    eager_steps, compiled_steps = make_steps(), make_steps()
    torch.testing.assert_close(compiled(x, compiled_steps, make_more()), fn(x, eager_steps, make_more()))
    assert len(compiled_steps) == len(eager_steps) and counter.frame_count == 1
    return eager_steps
