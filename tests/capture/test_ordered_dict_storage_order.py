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
