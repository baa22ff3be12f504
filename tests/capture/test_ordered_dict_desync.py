"""dict's own methods called on an OrderedDict (`dict.pop(od, k)`, `dict.update(od, d)`, ...) change
its storage but not its order bookkeeping; CPython then answers some questions exactly (len, `in`,
`[k]`, `==` with a dict, OrderedDict's own pop of an untouched key, repr while no stale node is about)
and others by accident of its hash table. kiln captures the first kind in one graph and refuses the
second, never rebuilding such a dict as a consistent one."""
import collections

import pytest
import torch

import kiln
from tests.utils import check_graphs

OD = collections.OrderedDict


def _reads(d):
    """What CPython reads from the storage only."""
    return len(d), "a" in d, "zz" in d, d.get("zz", -1), bool(d), type(d).__name__


def removed_keys(x):
    d = OD(a=1, b=2, c=3)
    first = dict.pop(d, "b")
    state = _reads(d), d == {"a": 1, "c": 3}, d != {"a": 1}, d["c"]
    own = OD.pop(d, "a"), d.pop("zz", "default")  # an untouched key's node; an absent key's empty slot
    try:
        d.pop("zz")
        missing = None
    except KeyError as e:
        missing = e.args
    e = OD(a=1)
    last = dict.popitem(e)
    f = OD(a=1, b=2)
    dict.__delitem__(f, "a")
    return x + first, state, own, missing, last, len(e), e == {}, len(f), f == {"b": 2}


def added_keys(x):
    d = OD(a=1, b=2)
    merged = dict.__ior__(d, {"b": 3, "c": 4})
    state = merged is d, _reads(d), d == {"a": 1, "b": 3, "c": 4}
    set_default = dict.setdefault(d, "e", 5), OD.setdefault(d, "f", 6), d.setdefault("a", 0)
    dict.update(d, OD(g=7))
    OD.update(d, {"h": 8}, i=9)
    d["a"] = 10
    return x * 2, state, set_default, len(d), d == {"a": 10, "b": 3, "c": 4, "e": 5, "f": 6, "g": 7, "h": 8, "i": 9}


def printed(x):
    d = OD(a=1, b=2)
    dict.update(d, {"c": 3})  # "c" has no node: CPython's repr and dict(d) walk a, b only
    e = OD(a=1)
    dict.clear(e)  # an empty storage prints as OrderedDict() whatever nodes are left
    return x + 1, repr(d), f"{d}", str(d), dict(d), f"{e!r}", repr(e)


@pytest.mark.parametrize("fn", [removed_keys, added_keys, printed])
def test_what_cpython_reads_from_the_storage_is_one_graph(fn):
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


def iterated(x):
    d = OD(a=1, b=2)
    dict.pop(d, "b")  # b's node is stale: CPython's list(d) raises KeyError('b')
    return x + 1, list(d)


def compared(x):
    d = OD(a=1, b=2)
    dict.setdefault(d, "c", 3)
    return x + 1, d == OD(a=1, b=2, c=3)  # equal storage: the order decides, which the nodes garble


def returned(x):
    d = OD(a=1, b=2)
    dict.pop(d, "b")
    return x + 1, d


@pytest.mark.parametrize("fn", [iterated, compared, returned])
def test_what_depends_on_the_hash_table_is_refused(fn):
    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(2))


def test_without_fullgraph_the_frame_runs_as_eager_does():
    with pytest.raises(KeyError):
        iterated(torch.randn(2))
    with pytest.raises(KeyError):
        kiln.compile(iterated, backend="eager")(torch.randn(2))
    check_graphs(compared, torch.randn(2))
    _, out = kiln.compile(returned, backend="eager")(torch.randn(2))
    assert type(out) is OD and len(out) == 1  # the real object, with its stale node
    with pytest.raises(KeyError):
        list(out)


def test_an_existing_ordered_dict_still_breaks_at_the_bypassing_call():
    def fn(x, d):
        dict.pop(d, "b")
        return x + len(d)
    mine, theirs = OD(a=1, b=2), OD(a=1, b=2)
    out = kiln.compile(fn, backend="eager")(torch.ones(1), mine)
    assert torch.equal(out, fn(torch.ones(1), theirs)) and len(mine) == len(theirs) == 1
    with pytest.raises(KeyError):  # the real object's bookkeeping, as eager left it
        list(mine)


def library_dicts_as_text(x):
    o = OD(a=1)
    dd = collections.defaultdict(list, k=[1])
    c = collections.Counter("abca")
    return x + 1, f"{o}", repr(dd), str(c), f"{o!r:>40}"


def test_library_dicts_print_as_their_own_kind():
    check_graphs(library_dicts_as_text, torch.randn(2), graphs=1, fullgraph=True)
