"""Keys/items views compared with sets and views as CPython's dictview_richcompare does it (sizes, then
each item looked up, an items view comparing values with ==, which may run a class's own __eq__ and
raise), and a view's `.mapping` (a read-only proxy of the live dict). Compiled in one graph, results as
eager's."""
import operator

import pytest
import torch

import kiln
from tests.utils import check_graphs


class Loud(Exception):
    pass


class Refuses:
    """Hashable, but equality with anything not itself raises."""

    def __eq__(self, other):
        raise Loud

    def __hash__(self):
        return 7


class Always:
    def __eq__(self, other):
        return True

    def __hash__(self):
        return 3


_CMP = [operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge]


@pytest.mark.parametrize("op", _CMP, ids=lambda op: op.__name__)
def test_items_views_compare_values_with_their_own_eq(op):
    def fn(x):
        a, b = {1: Always(), 2: 5}, {1: Always(), 2: 5, 3: 6}
        return x + 1, op(a.items(), b.items()), op(b.items(), a.items()), op(a.keys(), {1, 2}), op({1}, a.keys())
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


@pytest.mark.parametrize("op", [operator.eq, operator.ne, operator.le, operator.ge], ids=lambda op: op.__name__)
def test_a_raising_eq_in_an_items_comparison_propagates(op):
    def fn(x):
        a, b = {1: Refuses()}, {1: Refuses()}
        try:
            op(a.items(), b.items())
        except Loud:
            return x + 1
        return x - 1
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


def test_a_views_mapping_is_a_live_read_only_proxy():
    def fn(x):
        d = {"a": x}
        m = d.items().mapping
        d["b"] = 2
        return m["a"] * m["b"], dict(m), type(m).__name__, len(m)
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


@pytest.mark.parametrize("op", [operator.and_, operator.or_, operator.sub, operator.xor, operator.le, operator.eq],
                         ids=lambda op: op.__name__)
def test_items_views_holding_tensors_as_sets(op):
    def fn(x, y):
        a, b = {"p": x, "q": y}, {"p": x, "r": y}
        out, mixed = op(a.items(), b.items()), op(a.items(), {("p", x), ("q", y)})
        return x + 1, [len(r) if isinstance(r, set) else r for r in (out, mixed)]  # (sets of tensors: sizes)
    check_graphs(fn, torch.randn(2), torch.randn(2), graphs=1, fullgraph=True)
