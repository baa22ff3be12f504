"""dict methods' argument errors as CPython raises them (caught inside the frame), and
types.MappingProxyType made in the frame as a live read-only view of its dict, during and after the
call; eager is the oracle (results and the dicts' state after the call)."""
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
