"""User subclasses of set and frozenset, set operators and dict views: made in the frame and passed in,
their own Python methods run, the base's C methods modelled (results of plain set/frozenset type, as
CPython's), mutations written back past the subclass's overrides. Each runs eagerly and compiled in one
graph; results (with their types and iteration order) and after-call state compared."""
import collections
import operator
import os
import subprocess
import sys
import pathlib

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs

REPO = pathlib.Path(__file__).resolve().parents[2]


class TagSet(set):
    def size_twice(self):
        return len(self) * 2


class Frozen(frozenset):
    def size_twice(self):
        return len(self) * 2


class OwnOps(set):
    """Python operator methods: the reflected one must run first when it is on the right of a set."""
    def __or__(self, other):
        return "own-or"

    def __ror__(self, other):
        return "own-ror"

    def __contains__(self, item):
        return item == "anything"


class GuardedAdd(TagSet):
    def add(self, item):  # capture's write-back must not call the override
        raise RuntimeError("not to be called")

    def __ior__(self, other):
        raise RuntimeError("not to be called")


def _described(s):
    """A set's type and items in iteration order: what equality alone would not compare."""
    return type(s).__name__, list(s)


def made_in_frame(x):
    s = TagSet([1, 2])
    s.add(3)
    s.update([9, 17])  # (9 and 17 share 1's slot in a small table: the order shows how they went in)
    s.discard(2)
    s.tag = "made"
    f = Frozen([1, 25, 9])
    u = s | {33}
    g = f | {41}
    return (x * s.size_twice() + f.size_twice(), _described(s), s.tag, _described(f), _described(u), _described(g),
            isinstance(s, set), isinstance(f, frozenset), type(s) is TagSet, s == {1, 3, 9, 17}, f <= s)


def test_set_and_frozenset_subclasses_made_in_the_frame():
    check_graphs(made_in_frame, torch.randn(3), graphs=1, fullgraph=True)


def in_place_and_reflected(x):
    s = TagSet([1, 9])
    alias = s
    s |= {17, 2}  # set's own in-place or: the same object, still a TagSet
    f = Frozen([1])
    alias_f = f
    f |= {9}  # a frozenset has no in-place form: a new plain frozenset
    return x + 1, _described(s), s is alias, _described(f), f is alias_f, _described(alias_f)


def test_in_place_operators_follow_the_base():
    check_graphs(in_place_and_reflected, torch.randn(3), graphs=1, fullgraph=True)


def own_operators(x):
    plain = {1, 2}
    o = OwnOps([1])
    return x + 1, o | plain, plain | o, "anything" in o, 1 in o


def test_a_subclass_own_operator_methods_run_in_cpythons_order():
    check_graphs(own_operators, torch.randn(3), graphs=1, fullgraph=True)


def passed_in(x, s, f):
    if 3 in s:
        x = x * 2
    set.add(s, 4)  # (the base's method, past the override)
    s -= {1}
    s.seen = True
    return x * s.size_twice() * f.size_twice(), _described(s | f)


def test_instances_passed_in_are_read_and_written_back_past_their_overrides():
    x = torch.randn(3)
    s, f = GuardedAdd([1, 3]), Frozen([5, 6])
    s.before = 1
    eager_s = GuardedAdd([1, 3])
    eager_s.before = 1
    expected = passed_in(x, eager_s, Frozen([5, 6]))
    counter = CompileCounter()
    actual = kiln.compile(passed_in, backend=counter, fullgraph=True)(x, s, f)
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1] == expected[1]
    assert _described(s) == _described(eager_s) and vars(s) == vars(eager_s) == {"before": 1, "seen": True}
    assert counter.frame_count == 1
    # a different set recompiles (its items are guarded), never a stale answer
    other, eager_other = GuardedAdd([7]), GuardedAdd([7])
    torch.testing.assert_close(kiln.compile(passed_in, backend=counter, fullgraph=True)(x, other, f)[0],
                               passed_in(x, eager_other, f)[0])
    assert _described(other) == _described(eager_other)


_BINARY = [operator.or_, operator.and_, operator.sub, operator.xor,
           operator.ior, operator.iand, operator.isub, operator.ixor]


@pytest.mark.parametrize("op", _BINARY, ids=lambda op: op.__name__)
def test_operator_functions_on_views_with_tensor_values_and_subclasses(op):
    def fn(x):
        a = {1: x, 9: x + 1, 2: x * 2}
        b = {9: x, 3: x}
        s = TagSet([17, 1, 4])
        return (x.sum(), list(op(a.keys(), b.keys())), list(op(b.keys(), a.keys())), list(op(a.keys(), s)),
                list(op(s, a.keys())), type(op(s, a.keys())).__name__, list(op({25, 1}, a.keys())))
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


@pytest.mark.parametrize("op", [operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge],
                         ids=lambda op: op.__name__)
def test_comparisons_of_sets_subclasses_and_views(op):
    def fn(x):
        keys = {1: x, 2: x}.keys()
        u = TagSet([1, 2, 3])
        return x + 1, op(keys, u), op(u, keys), op({1, 2}, u), op(u, {1, 2}), op(Frozen([1, 2]), keys)
    check_graphs(fn, torch.randn(2), graphs=1, fullgraph=True)


_ORDER_PROGRAM = '''
import torch, kiln
def fn(x):
    return x + 1, list({"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"})
x = torch.ones(2)
assert fn(x)[1] == kiln.compile(fn, backend="eager")(x)[1], "a set's order from another process"
'''


def test_an_entry_that_read_a_set_order_is_not_loaded_by_another_process(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(_ORDER_PROGRAM)
    for seed in ("1", "2", "3"):  # string hashing, so the sets' order, differs between these processes
        env = {**os.environ, "PYTHONPATH": str(REPO), "KILN_CACHE_DIR": str(tmp_path / "cache"),
               "PYTHONHASHSEED": seed}
        env.pop("KILN_CAPTURE_CACHE", None)
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]


def ordered_dict_base_mutators(x):
    d = collections.OrderedDict(a=1)
    dict.__setitem__(d, "a", 5)  # a value of a key it has: its order bookkeeping stays right
    return x * d["a"], list(d)


def test_dict_methods_keeping_an_ordered_dicts_keys_are_followed():
    check_graphs(ordered_dict_base_mutators, torch.randn(2), graphs=1, fullgraph=True)


def ordered_dict_bypassed(x):
    d = collections.OrderedDict(a=1)
    dict.__setitem__(d, "b", 2)  # bypasses OrderedDict's own order: CPython's list(d) misses "b"
    return x + 1, list(d), len(d)


def test_dict_methods_that_bypass_an_ordered_dicts_order_break_rather_than_guess():
    check_graphs(ordered_dict_bypassed, torch.randn(2))
    with pytest.raises(kiln.Unsupported):
        kiln.compile(ordered_dict_bypassed, backend="eager", fullgraph=True)(torch.randn(2))
