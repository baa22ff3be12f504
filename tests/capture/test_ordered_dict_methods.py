"""OrderedDict's (and defaultdict's) own C methods (move_to_end, popitem(last=), copy, __copy__, ...) read from an instance or
called unbound (`OrderedDict.move_to_end(d, k)`), on OrderedDicts and their subclasses, and a subclass
whose Python __new__ calls `super().__new__`: compiled in one graph, results and state as eager's."""
import collections

import torch

import kiln
from tests.utils import check_graphs


class Ordered(collections.OrderedDict):
    def first(self):
        return next(iter(self))


class WithNew(collections.OrderedDict):
    def __new__(cls, *args, **kwargs):
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


def _methods_read_from_instances(x, cls):
    d = cls.fromkeys("abcd", 1)
    move, pop = d.move_to_end, d.popitem  # bound C methods of OrderedDict, called later
    move("a")
    collections.OrderedDict.move_to_end(d, "c", last=False)
    last = pop(last=False)
    try:
        d.move_to_end("zz")
        missing = False
    except KeyError:
        missing = True
    c = collections.OrderedDict.copy(d)
    clear = d.clear
    clear()
    return x + len(c), list(c), type(c).__name__, last, missing, list(d)


def test_ordered_dict_methods_read_from_an_instance_or_unbound():
    check_graphs(_methods_read_from_instances, torch.randn(2), collections.OrderedDict, graphs=1, fullgraph=True)


def test_the_same_on_a_subclass_with_methods_of_its_own():
    def fn(x):
        out = _methods_read_from_instances(x, Ordered)
        d = Ordered(b=1, a=2)
        d.move_to_end("b")
        return out, d.first(), list(d)
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


def test_a_subclass_whose_new_calls_dicts_new():
    def fn(x):
        d = WithNew()
        d["k"] = x
        e = dict.__new__(collections.OrderedDict)
        e["j"] = 2
        return d["k"] + e["j"], type(d).__name__, list(d), type(e).__name__
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


def test_a_defaultdicts_copy_dunder_keeps_its_factory():
    def fn(x):
        d = collections.defaultdict(list, {1: x})
        c = d.__copy__()
        c[2].append(3)
        return c[1] * 2, c.default_factory is list, dict(c), dict(d)
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)
