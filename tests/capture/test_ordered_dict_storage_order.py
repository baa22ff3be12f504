"""An OrderedDict has two orders: its own (what iterating it shows; move_to_end changes it) and its
storage's (insertion order, what dict's own methods read: `dict.keys(od)`, `dict.popitem(od)`, ...).
Compiled code must leave both as eager does: on a dict rebuilt at a graph break or returned, on an
input written in the frame, and on an input whose storage order already differed from its own."""
import collections

import torch

import kiln
from tests.utils import CompileCounter, assert_equal_state

OD = collections.OrderedDict


def orders(d):
    return list(d), list(dict.keys(d)), list(dict.values(d))


def make(storage, links):
    """An OrderedDict whose storage holds `storage` in that order and whose own order is `links`."""
    d = OD((k, i) for i, k in enumerate(storage))
    for k in links:
        d.move_to_end(k)
    return d


def compare(fn, *specs, graphs=None, fullgraph=False):
    """Run fn eagerly and compiled on fresh OrderedDicts built from `specs` ((storage, links) pairs;
    deepcopy would lose the storage order) and a tensor; results and both orders of each input after
    the call must match, over two calls (the second one reuses what the first compiled)."""
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, fullgraph=fullgraph)
    for _ in range(2):
        x = torch.randn(3)
        eager_in, compiled_in = [make(*s) for s in specs], [make(*s) for s in specs]
        expected, actual = fn(x, *eager_in), compiled(x, *compiled_in)
        assert_equal_state(actual, expected)
        for e, c in zip(eager_in, compiled_in):
            assert orders(c) == orders(e), (orders(c), orders(e))
    if graphs is not None:
        assert counter.frame_count == graphs, counter.frame_count
    return counter


def returned_reordered(x):
    d = OD(a=1, b=2, c=3)
    d.move_to_end("a")
    return x + 1, d


def test_returned_dict_keeps_both_orders():
    counter = CompileCounter()
    compiled = kiln.compile(returned_reordered, backend=counter)
    d = compiled(torch.randn(2))[1]
    assert orders(d) == orders(returned_reordered(torch.randn(2))[1])


def popitem_after_break(x):
    d = OD(a=1, b=2)
    d.move_to_end("a")
    x = x + 1
    print("break")
    return x, dict.popitem(d), list(d)


def test_dict_popitem_after_break():
    compare(popitem_after_break)


def storage_after_break(x):
    d = OD(a=1, b=2, c=3)
    d.move_to_end("a")
    d.move_to_end("c", last=False)
    del d["b"]
    d["b"] = 7
    d["z"] = 0
    print("break")
    return x * 2, orders(d)


def test_storage_order_after_break():
    compare(storage_after_break)


def reads_storage_order(x):
    d = OD(a=1, b=2, c=3)
    d.move_to_end("a")
    return x + 1, list(dict.keys(d)), list(dict.items(d)), list(dict.__iter__(d)), list(d), list(dict.copy(d))


def test_dict_methods_read_storage_order_in_frame():
    compare(reads_storage_order)


def writes_input(x, d):
    d.move_to_end("a")
    d["z"] = 5
    return x + 1


def test_input_written_in_frame_keeps_storage_order():
    compare(writes_input, ("abc", "abc"))


def writes_desynced_input(x, d):
    d["z"] = len(d)
    return x + 1


def test_input_with_desynced_storage_written():
    compare(writes_desynced_input, ("abc", "bca"))


def reads_input_storage(x, d):
    return x + 1, list(dict.keys(d)), list(d)


def test_input_storage_order_is_guarded():
    counter = CompileCounter()
    compiled = kiln.compile(reads_input_storage, backend=counter)
    for spec in [("abc", "abc"), ("abc", "bca"), ("abc", "abc"), ("bca", "bca")]:
        x = torch.randn(2)
        assert_equal_state(compiled(x, make(*spec)), reads_input_storage(x, make(*spec)))


def pops_reordered_input(x, d):
    d.move_to_end("b", last=False)
    out = d.popitem(last=False)
    print("break")
    d["b"] = 1
    return x + 1, out


def test_input_reordered_across_break():
    compare(pops_reordered_input, ("abc", "cab"))


class Sub(OD):
    """A user's OrderedDict: rebuilt and written back past its own methods."""

    def move_to_end(self, key, last=True):  # (a restore must not call this)
        raise AssertionError("the subclass's own move_to_end ran")


def make_sub(storage, links):
    d = Sub((k, i) for i, k in enumerate(storage))
    for k in links:
        OD.move_to_end(d, k)
    return d


def subclass_made_in_frame(x):
    d = Sub(a=1, b=2, c=3)
    OD.move_to_end(d, "a")
    d["z"] = 4
    print("break")
    return x + 1, orders(d), d


def test_subclass_rebuilt_with_both_orders():
    x = torch.randn(2)
    expected = subclass_made_in_frame(x)
    actual = kiln.compile(subclass_made_in_frame, backend=CompileCounter())(x)
    assert actual[1] == expected[1] and orders(actual[2]) == orders(expected[2]) and type(actual[2]) is Sub


def writes_subclass(x, d):
    OD.move_to_end(d, "b")
    d["z"] = 5
    return x + 1, list(d)


def test_subclass_input_written_and_guarded():
    counter = CompileCounter()
    compiled = kiln.compile(writes_subclass, backend=counter)
    for spec in [("abc", "abc"), ("abc", "cab"), ("abc", "cab"), ("cab", "cab")]:
        x = torch.randn(2)
        eager_in, compiled_in = make_sub(*spec), make_sub(*spec)
        assert_equal_state(compiled(x, compiled_in), writes_subclass(x, eager_in))
        assert orders(compiled_in) == orders(eager_in)


def takes_storage_view(x, view, d):
    d.move_to_end(next(iter(d)))
    return x + 1, list(view)


def test_dict_view_of_an_ordered_dict_follows_storage():
    counter = CompileCounter()
    compiled = kiln.compile(takes_storage_view, backend=counter)
    for spec in [("abc", "abc"), ("abc", "bca")]:
        x = torch.randn(2)
        e, c = make(*spec), make(*spec)
        assert_equal_state(compiled(x, dict.keys(c), c), takes_storage_view(x, dict.keys(e), e))
        assert orders(c) == orders(e)


def reorders_in_one_graph(x, d):
    d.move_to_end("a")
    d["q"] = 1
    del d["b"]
    d.move_to_end("c", last=False)
    return x + 1, list(d), len(d)


def test_reordered_input_in_one_graph():
    compare(reorders_in_one_graph, ("abc", "abc"), graphs=1, fullgraph=True)
    compare(reorders_in_one_graph, ("bac", "cab"), graphs=1, fullgraph=True)


def dicts_own_copy(x):
    d = OD(a=1, b=2)
    d.move_to_end("a")
    c, u = dict.copy(d), dict.__or__(d, {"z": 0})
    return x + 1, type(c).__name__, list(c), type(u).__name__, list(u), type(dict.copy(Sub(q=1))).__name__


def test_dicts_own_copy_and_union_are_plain_dicts():
    """(dict.copy and dict.__or__ copy an OrderedDict in its own order, into a plain dict)"""
    compare(dicts_own_copy, graphs=1, fullgraph=True)


def stores_then_reorders(x, d):
    d["e"] = 1  # (a plain store: last in both orders)
    d["d"] = 0
    d.move_to_end("d", last=False)
    return x + 1, list(d)


def test_plain_stores_then_move_to_end_on_desynced_input():
    compare(stores_then_reorders, ("abc", "bca"), graphs=1, fullgraph=True)


def native_reader(d):
    return list(dict.keys(d)), list(d)


def passes_to_native(x):
    d = OD(a=1, b=2, c=3)
    d.move_to_end("a")
    return x + 1, kiln.disable(native_reader)(d)


def test_value_handed_to_native_code_keeps_both_orders():
    compare(passes_to_native)
