"""Builtins and protocols over values capture tracks, as CPython evaluates them: min/max of tensors,
frozensets holding tensors, sequence equality with its identity shortcut, a metaclass's __getattr__,
str() through a class's __str__, catchable AttributeErrors, user iterators, modules made in forward,
process-state queries that are guarded. Each runs eagerly and compiled in one graph."""
import collections
import sys

import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_same, check_graphs


def t(*shape):
    return torch.randn(*shape)


def min_max_of_tensors(a, b):
    s, u = a.sum(), b.sum()
    lo = min(max(s, 0), 1)
    return max(s, u) - min(s, u) + lo, max([s, u, s * 2]), min(u, 0.5), a + b


class _Pair(collections.namedtuple("_Pair", "a b")):
    pass


def frozenset_and_tuple_equality(x):
    s = frozenset({x})
    same = frozenset(s)
    p, q = _Pair(x, 1), _Pair(x, 1)
    return x + len(same), x in s, p == q, (x, 2) == (x, 3), [x] != [x], type(s) is frozenset


class _Meta(type):
    def __getattr__(cls, name):
        return len(name)


class _WithMeta(metaclass=_Meta):
    attr = 3


def metaclass_getattr_and_errors(x):
    def f(a=1, b=2):
        pass

    try:
        f.missing + 1
    except AttributeError:
        x = x.sin()
    return x + _WithMeta.attr + _WithMeta.dynamic, len(f.__defaults__) * f.__code__.co_argcount


class _Named:
    def __str__(self):
        return "named"


def str_repr_and_sequences(x):
    return str(_Named()), 3 * [x, 1], sum(4 * [x]), x * sys.getrecursionlimit()


class _Countdown:
    def __init__(self):
        self.n = 3

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        return self.n


def user_iterator(x):
    for i, v in enumerate(_Countdown()):
        x = x + i * v
    return x


def set_init_and_mappingproxy(x):
    s = {1, 2}
    s.__init__({3})
    f = frozenset({4})
    f.__init__({5})
    keys = sorted(k for k, _ in vars(_Named).items() if not k.startswith("__") or k == "__str__")
    return x + len(s) + (3 in s) + (5 in f), keys


def modules_made_in_forward(x):
    y = torch.nn.Softmax(dim=-1)(x)
    return torch.nn.ReLU()(y - 0.2) + torch.nn.Dropout(0.0)(x)


@pytest.mark.parametrize("fn", [min_max_of_tensors, frozenset_and_tuple_equality, metaclass_getattr_and_errors,
                                str_repr_and_sequences, user_iterator, set_init_and_mappingproxy,
                                modules_made_in_forward])
def test_one_graph(fn):
    args = (t(3), t(3)) if fn is min_max_of_tensors else (t(3),)
    check_graphs(fn, *args, graphs=1, fullgraph=True)


def test_modules_made_in_forward_compile_once():
    counter = CompileCounter()
    compiled = kiln.compile(modules_made_in_forward, backend=counter, fullgraph=True)
    for _ in range(3):
        assert_same(modules_made_in_forward, compiled, t(3))
    assert counter.frame_count == 1  # the entry owns the module it made (its guards hold it weakly)


def test_a_changed_recursion_limit_recompiles():
    counter = CompileCounter()
    fn = lambda x: x * sys.getrecursionlimit()  # noqa: E731
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    old = sys.getrecursionlimit()
    try:
        assert_same(fn, compiled, t(2))
        sys.setrecursionlimit(old + 7)
        assert_same(fn, compiled, t(2))
    finally:
        sys.setrecursionlimit(old)
    assert counter.frame_count == 2


def dict_keyed_by_sizes(x, cache):
    if x.shape not in cache:
        cache[x.shape] = x
    return x + cache[x.shape]


def test_existing_dict_keyed_by_sizes_one_graph():
    cache_eager, cache_compiled = {}, {}
    counter = CompileCounter()
    compiled = kiln.compile(dict_keyed_by_sizes, backend=counter, fullgraph=True)
    for _ in range(2):
        x = t(2, 3)
        torch.testing.assert_close(compiled(x, cache_compiled), dict_keyed_by_sizes(x, cache_eager))
    assert list(cache_compiled) == list(cache_eager) == [torch.Size([2, 3])]
    assert counter.frame_count == 2  # the second call finds the key the first added


def module_with_parameters_made_in_forward(x):
    return torch.nn.Linear(3, 3)(x)


def test_module_with_parameters_made_in_forward_breaks_the_graph():
    with pytest.raises(kiln.Unsupported, match="Linear"):
        kiln.compile(module_with_parameters_made_in_forward, backend=CompileCounter(), fullgraph=True)(t(2, 3))


def missing_argument(x):
    class NeedsArg:
        def __init__(self, value):
            self.value = value

    return NeedsArg(), x


def test_unsupported_names_the_source_line():
    with pytest.raises(kiln.Unsupported, match=r"NeedsArg\(\), x"):
        kiln.compile(missing_argument, backend=CompileCounter(), fullgraph=True)(t(2))


# ---- nn.Module attribute lookup, lazy modules, overridden forward ----------------------------------------
class _Base(torch.nn.Module):
    def linear(self, x):
        return x * 3.0


class _Shadowed(_Base):
    """A method of the class named like a submodule wins over it, as in Python's attribute lookup."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.act = torch.nn.ReLU()
        self.scale = 0.5

    def act(self, x):
        return x * 1.2

    def forward(self, x):
        return self.act(self.linear(x)) * self.scale


class _Indexable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.ReLU()])

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def forward(self, x):
        for i in range(len(self)):
            x = self[i](x)
        return x


@pytest.mark.parametrize("make", [_Shadowed, _Indexable])
def test_module_attribute_lookup_one_graph(make):
    check_graphs(make(), t(2, 3), graphs=1, fullgraph=True)


def test_lazy_module_is_initialized_from_its_first_inputs():
    eager = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    x = t(2, 3)
    counter = CompileCounter()
    compiled = kiln.compile(lazy, backend=counter, fullgraph=True)
    torch.manual_seed(0)  # both draw their weights on the first call
    actual = compiled(x)
    torch.manual_seed(0)
    torch.testing.assert_close(actual, eager(x))
    assert isinstance(lazy[0], torch.nn.Linear) and lazy[0].weight.shape == (4, 3)
    torch.testing.assert_close(compiled(x), eager(x))
    assert counter.frame_count == 1


def test_instance_forward_override_and_module_keyed_dict():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x + 1

    mod = Plain()
    mod.forward = lambda x: x - 1
    weights = {mod: 3.0}

    def fn(x):
        return mod(x) * weights[mod]

    check_graphs(fn, t(3), graphs=1, fullgraph=True)


_STORED_BY_CALLEE = 0


def _store_global(x):
    global _STORED_BY_CALLEE
    _STORED_BY_CALLEE = 5
    return x


def test_global_stored_by_a_callee_is_read_back_through_its_module():
    this_module = sys.modules[__name__]

    def fn(x):
        _store_global(x)
        return x + this_module._STORED_BY_CALLEE

    global _STORED_BY_CALLEE
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    x = t(3)
    _STORED_BY_CALLEE = 0
    torch.testing.assert_close(compiled(x), x + 5)
    assert _STORED_BY_CALLEE == 5 and counter.frame_count == 1


class _OwnCall(torch.nn.Module):
    def forward(self, x):
        return x + 1

    def __call__(self, x):
        return super().__call__(x) * 2


def test_module_subclass_with_its_own_call_runs_it():
    mod = _OwnCall()
    check_graphs(lambda x: mod(x) - 1, t(3), graphs=1, fullgraph=True)


class _ShadowingMeta(type):
    @property
    def __dict__(cls):  # a metaclass's properties shadow type's own __dict__ and __mro__
        return {"shadow": 1}

    @property
    def __mro__(cls):
        return ("shadow",)


class _Shadowed(metaclass=_ShadowingMeta):
    marker = 7


def reads_shadowed_class_attributes(x):
    return x + _Shadowed.__dict__["shadow"] + len(_Shadowed.__mro__)


def test_metaclass_shadowing_mro_and_dict_is_read_as_python_does():
    # (was an internal error: the class watch walked the shadowing __mro__)
    check_graphs(reads_shadowed_class_attributes, t(2), graphs=1, fullgraph=True)


def hasattr_on_containers(x, d, lst, tup):
    y = x.to("cpu") if hasattr(d, "to") else torch.cos(d["a"])  # a dict has no .to
    z = x + 1 if hasattr(lst, "shape") else x - 1
    return (y, z, hasattr(d, "items"), hasattr(lst, "append"), hasattr(tup, "count"), hasattr(tup, "append"),
            hasattr({"k": 1}, "keys"), hasattr([], "nope"), hasattr(set(), "add"))


def test_hasattr_on_containers_asks_their_type():
    # (was True for any name: a wrong branch without fullgraph, an error with it)
    check_graphs(hasattr_on_containers, t(2), {"a": t(2)}, [1], (1,), graphs=1, fullgraph=True)
    check_graphs(hasattr_on_containers, t(2), {"a": t(2)}, [1], (1,), graphs=1)
