"""dict methods' argument errors as CPython raises them (caught inside the frame), and
types.MappingProxyType made in the frame as a live read-only view of its dict, during and after the
call; eager is the oracle (results and the dicts' state after the call)."""
import collections
import functools
import types

import pytest
import torch

import kiln
from tests.utils import assert_same, check_graphs


def update_with_two_mappings(x):
    try:
        {}.update({"a": 1}, {"b": 2})
    except TypeError as e:
        return x + 1, str(e)
    return x, "no error"


def update_with_a_triple(x):
    try:
        {}.update([("a", 1), (1, 2, 3)])
    except ValueError as e:
        return x + 1, str(e)
    return x, "no error"


def proxy_sees_later_writes(x):
    d = {"a": 2, "b": 3}
    mp = types.MappingProxyType(d)
    d["c"] = 4
    return x * mp["a"] + len(mp), "c" in mp, mp, type(mp.copy())


def wrong_arguments_raise_type_error(x):
    d = {"a": 1}
    calls = (lambda: d.clear(1), lambda: d.get(), lambda: d.copy(1), lambda: d | 1, lambda: dict.fromkeys(),
             lambda: dict.fromkeys(1, 2), lambda: d.pop(), lambda: d.keys(1), lambda: {}.popitem(1))
    raised = []
    for call in calls:
        try:
            call()
            raised.append(None)
        except TypeError:
            raised.append("TypeError")
    d |= [("b", 2)]  # |= takes pairs, | only a dict
    return x + 1, raised, d


def dict_equality(x, existing):
    a, b, c = {"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1, "b": 3}
    first, second = collections.OrderedDict(a=1, b=2), collections.OrderedDict(b=2, a=1)
    same_tensor = {"t": x} == {"t": x}  # identical values are equal without comparing them
    return (x * (a == b), a != c, a == c, first == second, first == b, existing == a, a.__eq__(b),
            dict.__eq__(a, c), a.__eq__(5), same_tensor)


def fromkeys_of_each_kind(x, y):
    d = dict.fromkeys(["a", "b"], x + 1)
    ordered = collections.OrderedDict.fromkeys(("a", "b"), value=y)  # OrderedDict's takes value= by name
    defaults = collections.defaultdict.fromkeys(iter(d), x - 2)
    try:
        dict.fromkeys(["a"], value=1)  # dict's does not
        keyword = "accepted"
    except TypeError:
        keyword = "TypeError"
    return d["a"] * ordered["b"] + defaults["a"], keyword, type(ordered), type(defaults)


def union_with_a_subclass_on_the_right(x):
    ordered, defaults, plain = collections.OrderedDict(b=3, c=4), collections.defaultdict(int, z=1), {"a": 1, "b": 2}
    first, second, third = plain | ordered, plain | defaults, ordered | plain  # the subclass's __ror__ first
    return x + 1, first, type(first), second, type(second), second.default_factory, third, type(third)


@pytest.mark.parametrize("fn, args", [(wrong_arguments_raise_type_error, ()), (dict_equality, ({"b": 2, "a": 1},)),
                                      (fromkeys_of_each_kind, (torch.full((2,), 3.0),)),
                                      pytest.param(union_with_a_subclass_on_the_right, (), marks=pytest.mark.torch_differs(
                                          "torch.compile cannot return a defaultdict made in the frame"))],
                         ids=["wrong arguments", "equality", "fromkeys", "union"])
def test_dict_methods_as_cpython(fn, args):
    check_graphs(fn, torch.ones(2), *args, graphs=1, fullgraph=True)


@pytest.mark.parametrize("fn", [
    pytest.param(update_with_two_mappings, marks=pytest.mark.torch_differs("torch.compile words the TypeError its own way")),
    update_with_a_triple, proxy_sees_later_writes],
                         ids=lambda f: f.__name__)
def test_dict_semantics_in_one_graph(fn):
    check_graphs(fn, torch.ones(2), graphs=1, fullgraph=True)


def test_a_proxy_of_an_existing_dict_stays_live_after_the_call():
    shared = {"a": 1}

    def fn(x):
        mp = types.MappingProxyType(shared)
        shared["b"] = 2
        return x + mp["a"], mp

    out, mp = assert_same(fn, kiln.compile(fn, backend="eager", fullgraph=True), torch.ones(2))
    assert type(mp) is types.MappingProxyType and dict(mp) == {"a": 1, "b": 2}
    shared["later"] = 3  # a view of the dict, not a copy made during capture
    assert mp["later"] == 3


class _Key:
    def __init__(self, v):
        self.v = v


def _add(x, y):
    return x + y


def objects_made_in_the_frame_as_keys(x):
    d = {}
    p = functools.partial(_add, y=1)
    first, second = _Key(1), _Key(1)  # equal contents, distinct keys: hashed by identity
    d[p], d[first], d[second] = 5, 2, 3
    return x * d[p] + d[first] * d[second], len(d), first in d, _Key(1) in d, list(d.values())


def test_objects_made_in_the_frame_are_dict_keys_by_identity():
    check_graphs(objects_made_in_the_frame_as_keys, torch.ones(2), graphs=1, fullgraph=True)
