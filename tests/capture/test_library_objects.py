"""Library objects real models touch, captured in one graph: os.environ, the C methods of builtin types,
functools (partial, wraps, lru_cache), collections (defaultdict, Counter, OrderedDict, deque).
Each program runs eagerly and compiled; results, argument state and graph counts are compared."""
import collections
import copy
import enum
import functools
import gc
import os
import pathlib
import weakref

import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_same, check_graphs


def t(*shape):
    return torch.randn(*shape)


# ---- os.environ -------------------------------------------------------------------------------------
def environ_reads(x):
    scale = float(os.environ.get("KILN_TEST_SCALE", "2"))
    if "KILN_TEST_FLAG" in os.environ:
        x = x + 1
    if os.getenv("KILN_TEST_UNSET") is None:
        x = x * 3
    return x * scale + len(os.environ["KILN_TEST_SCALE"])


def test_environ_reads_are_one_graph_and_a_changed_variable_recompiles(monkeypatch):
    monkeypatch.setenv("KILN_TEST_SCALE", "3")
    monkeypatch.delenv("KILN_TEST_FLAG", raising=False)
    monkeypatch.delenv("KILN_TEST_UNSET", raising=False)
    counter = CompileCounter()
    compiled = kiln.compile(environ_reads, backend=counter, fullgraph=True)
    x = t(4)
    assert_same(environ_reads, compiled, x)
    assert_same(environ_reads, compiled, x)
    assert counter.frame_count == 1
    monkeypatch.setenv("KILN_TEST_FLAG", "1")
    assert_same(environ_reads, compiled, x)
    monkeypatch.setenv("KILN_TEST_SCALE", "0.5")
    assert_same(environ_reads, compiled, x)
    assert counter.frame_count == 3
    monkeypatch.setenv("KILN_TEST_UNRELATED", "x")  # a variable the code never reads: no recompile
    assert_same(environ_reads, compiled, x)
    assert counter.frame_count == 3


def environ_write(x):
    os.environ["KILN_TEST_WRITTEN"] = "yes"
    return x + 1


def test_environ_write_is_a_side_effect_outside_the_graph(monkeypatch):
    monkeypatch.delenv("KILN_TEST_WRITTEN", raising=False)
    with pytest.raises(kiln.Unsupported):
        kiln.compile(environ_write, backend=CompileCounter(), fullgraph=True)(t(2))
    monkeypatch.delenv("KILN_TEST_WRITTEN", raising=False)
    check_graphs(environ_write, t(2))
    assert os.environ["KILN_TEST_WRITTEN"] == "yes"


def environ_missing_key(x):
    try:
        return x + len(os.environ["KILN_TEST_MISSING"])
    except KeyError:
        return x - 1


def test_environ_missing_key_raises_key_error_inside_capture(monkeypatch):
    monkeypatch.delenv("KILN_TEST_MISSING", raising=False)
    check_graphs(environ_missing_key, t(3), graphs=1, fullgraph=True)


# ---- methods of builtin types, unbound or on known values ------------------------------------------
def unbound_dict_and_list_methods(x):
    d = {"a": 1}
    d2 = {}
    dict.__setitem__(d2, "k", x)
    lst = []
    list.append(lst, x * 2)
    return (x + dict.get(d, "a") + dict.get(d, "b", 5), list.__contains__([1, 2], 2),
            tuple.__contains__((1, 2), 3), d2["k"] + lst[0])


def str_and_frozenset_methods(x):
    s = frozenset([1, 2])
    joined = "-".join(str(i) for i in range(3)) + ",".join(map(str, [4, 5]))
    return x + len(frozenset.union(s, {3})) + len(s.intersection([1])), joined, str.upper("ab")


def fromkeys(x):
    d = dict.fromkeys(["a", "b"], x)
    o = collections.OrderedDict.fromkeys("xyz")
    dd = collections.defaultdict.fromkeys("a", "b")
    dd["c"] = 3
    return d["a"] + 1, list(o), dd


def set_methods(x):
    s = {1, 2, 3}
    sym = s.symmetric_difference({2, 7})
    s.difference_update({1})
    s.intersection_update([2, 3, 9])
    popped = s.pop()
    return x + len(sym) + popped, s.isdisjoint({5}), s.issuperset(set()), sorted(sym)


def dict_mutation_methods(x):
    d = {"a": x}
    d.update([("b", x + 1)], c=2)
    d |= {"e": 4}
    merged = d | {"f": x}
    last = d.popitem()
    o = collections.OrderedDict(a=1, b=2, c=3)
    o.move_to_end("a")
    first = o.popitem(last=False)
    return d, merged, last, list(o.items()), first


@pytest.mark.parametrize("fn", [unbound_dict_and_list_methods, str_and_frozenset_methods, fromkeys, set_methods,
                                dict_mutation_methods])
def test_builtin_methods_one_graph(fn):
    check_graphs(fn, t(3), graphs=1, fullgraph=True)


# ---- functools ----------------------------------------------------------------------------------------
def partial_made_in_frame(x):
    f = lambda a, b: torch.sin(a) + torch.cos(b)  # noqa: E731
    p = functools.partial(f, b=x)
    q = functools.partial(functools.partial(torch.add, x), alpha=2)
    return (p(x), q(x), hasattr(p, "func"), hasattr(p, "__call__"), hasattr(p, "__name__"),
            p.keywords["b"] is x, len(p.args), q.func is torch.add, callable(p))


def partial_returned(x):
    return functools.partial(torch.mul, x), x + 1


def test_partial_made_in_frame_one_graph():
    check_graphs(partial_made_in_frame, t(3), graphs=1, fullgraph=True)


def test_partial_made_in_frame_is_rebuilt_when_returned():
    x = t(3)
    p, _ = kiln.compile(partial_returned, backend=CompileCounter(), fullgraph=True)(x)
    assert isinstance(p, functools.partial) and p.func is torch.mul
    torch.testing.assert_close(p(2.0), x * 2)


def function_attributes(x):
    def g(a):
        "g's doc"
        return a + 1

    g.tag = 3
    g.__doc__ = g.__doc__ + "!"
    return (g(x) * g.tag, g.__name__, g.__doc__, hasattr(g, "__code__"), hasattr(g, "nothing"),
            getattr(g, "nope", 5), g.__dict__["tag"])


def wraps_in_frame(x):
    def inner(a):
        "inner's doc"
        return a * 2

    @functools.wraps(inner)
    def wrapper(a):
        return inner(a) + 1

    return wrapper(x), wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ is inner


@functools.lru_cache(maxsize=None)
def _cached_scale(n):
    return n * 2


@functools.cache
def _cached_sin(a):
    return a.sin()


class _WithCachedMethod:
    @functools.lru_cache(maxsize=4)
    def offset(self, n):
        return n + 1


_holder = _WithCachedMethod()


def lru_cache_calls(x):
    return x + _cached_scale(3), _cached_sin(x), _cached_scale.__name__, x * _holder.offset(2)


@pytest.mark.parametrize("fn", [function_attributes, wraps_in_frame, lru_cache_calls])
def test_function_objects_one_graph(fn):
    check_graphs(fn, t(3), graphs=1, fullgraph=True)


def returns_function_with_attributes(x):
    def g(a):
        return a + 1

    g.tag = "t"
    g.__name__ = "renamed"
    return g, x + 1


def test_function_attributes_survive_a_rebuild():
    g, _ = kiln.compile(returns_function_with_attributes, backend=CompileCounter(), fullgraph=True)(t(2))
    assert g.tag == "t" and g.__name__ == "renamed" and g(1) == 2


# ---- collections --------------------------------------------------------------------------------------
def defaultdict_with_tensor_keys(x, w):
    d = collections.defaultdict(lambda: dict())
    d["a"] = x + 1
    d[w] = 3
    d.update({"b": x * 3})
    d.update([["c", x - 2], ("e", x + 2)])
    return d["b"], d["zz"], d[w], list(d)[1] is w, len(d)


def counter_basics(x):
    c = collections.Counter("abca")
    c.update(["a", "z"])
    c["q"] += 2
    return x + c["a"] + c["missing"], c.most_common(1), sorted(c.items())


def deque_methods(a):
    d = collections.deque([a, a + 1])
    d.append(a + 1)
    d.extend([a, 2])
    d.insert(0, "foo")
    tmp = d.pop()
    d.extendleft(collections.deque([tmp]))
    d[2] = "setitem"
    d = d.copy()
    d.append(d.popleft())
    d.rotate(2)
    b = collections.deque([1, 2, 3], maxlen=2)
    b.appendleft(0)
    return list(d), list(b), b.maxlen, len(d), type(d)


@pytest.mark.parametrize("fn", [defaultdict_with_tensor_keys, counter_basics, deque_methods])
def test_collections_one_graph(fn):
    check_graphs(fn, t(3), torch.nn.Parameter(torch.ones(2)), graphs=1, fullgraph=True) \
        if fn is defaultdict_with_tensor_keys else check_graphs(fn, t(3), graphs=1, fullgraph=True)


@pytest.mark.parametrize("factory", [list, dict, lambda: 0])
def test_existing_defaultdict_mutated_in_place(factory):
    param = torch.nn.Parameter(torch.ones(2))

    def run(dd, x):
        dd["a"] = x + 1
        dd[param] = 123
        return dd["b"], x * 2

    eager, compiled = collections.defaultdict(factory), collections.defaultdict(factory)
    counter = CompileCounter()
    x = t(3)
    expected = run(eager, x)
    actual = kiln.compile(run, backend=counter, fullgraph=True)(compiled, x)
    torch.testing.assert_close(actual[1], expected[1])
    assert actual[0] == expected[0] and list(compiled) == list(eager) and compiled[param] == 123
    torch.testing.assert_close(compiled["a"], eager["a"])
    assert counter.frame_count == 1


def test_existing_deque_mutated_in_place():
    def run(q, x):
        q.append(x)
        q.appendleft(x + 1)
        return x * len(q)

    eager, compiled = collections.deque([1, 2], maxlen=3), collections.deque([1, 2], maxlen=3)
    x = t(2)
    expected = run(eager, x)
    counter = CompileCounter()
    actual = kiln.compile(run, backend=counter, fullgraph=True)(compiled, x)
    torch.testing.assert_close(actual, expected)
    assert len(compiled) == len(eager) == 3 and compiled.maxlen == 3
    for a, e in zip(compiled, eager):
        torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(e))
    assert counter.frame_count == 1


# ---- copy.copy / copy.deepcopy -------------------------------------------------------------------------
class _Config:
    def __init__(self):
        self.width = 2
        self.names = ["x", "y"]
        self.sub = {"k": 2}


_config = _Config()


def deepcopy_existing_object(x):
    c = copy.deepcopy(_config)
    c.width = 5
    c.names.append("z")
    return x * c.width + len(c.names) + _config.width + len(_config.names), c.sub is _config.sub


def copies_of_containers(x):
    nested = [x, [x + 1]]
    shallow = copy.copy(nested)
    deep = copy.deepcopy(nested)
    shallow[1].append(1)
    d = copy.deepcopy({"a": [1, 2], "b": (3, [4]), "t": x})
    return nested, shallow, deep, deep[1] is nested[1], shallow[1] is nested[1], d, d["t"] is x


class _Pair:
    def __init__(self, v):
        self.v = v


def copy_of_object_made_in_frame(x):
    o = _Pair(x)
    o2 = copy.copy(o)
    o2.v = o2.v + 1
    o3 = copy.deepcopy(o)
    return o.v, o2.v, o3.v is o.v, type(o3) is _Pair


@pytest.mark.parametrize("fn", [deepcopy_existing_object, copies_of_containers, copy_of_object_made_in_frame])
def test_copies_one_graph(fn):
    check_graphs(fn, t(3), graphs=1, fullgraph=True)


def test_deepcopy_of_existing_object_is_guarded_on_its_state():
    counter = CompileCounter()
    compiled = kiln.compile(deepcopy_existing_object, backend=counter, fullgraph=True)
    x = t(2)
    assert_same(deepcopy_existing_object, compiled, x)
    _config.width = 7
    try:
        assert_same(deepcopy_existing_object, compiled, x)
    finally:
        _config.width = 2
    assert counter.frame_count == 2


# ---- objects with their own __setattr__ / __getattribute__ / __delattr__ ---------------------------------
class _Aliased:
    """Reads and writes of `hidden` go to `d_model`, as transformers' configs map attribute names."""
    attribute_map = {"hidden": "d_model"}

    def __init__(self):
        self.d_model = 4
        self.layers = 2

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def own_attribute_protocol(x):
    c = _Aliased()
    c.hidden = 8
    layers = c.layers
    del c.layers
    return x * c.hidden + layers, hasattr(c, "layers"), c.d_model, c.__dict__["d_model"]


def deepcopy_then_delattr(x):
    c = copy.deepcopy(_aliased)
    delattr(c, "layers")
    c.hidden = 3
    return x * c.d_model, hasattr(c, "layers"), _aliased.d_model


_aliased = _Aliased()


@pytest.mark.parametrize("fn", [own_attribute_protocol, deepcopy_then_delattr])
def test_own_attribute_protocol_one_graph(fn):
    check_graphs(fn, t(3), graphs=1, fullgraph=True)


def test_del_of_an_existing_objects_attribute_is_replayed():
    def run(obj, x):
        del obj.v
        return x + 1

    eager, compiled = _Pair(1), _Pair(1)
    x = t(2)
    torch.testing.assert_close(kiln.compile(run, backend=CompileCounter(), fullgraph=True)(compiled, x), run(eager, x))
    assert not hasattr(compiled, "v") and not hasattr(eager, "v")


# ---- weak references, enum lookups, paths, callable instances made in the frame -------------------------------
class _Padding(str, enum.Enum):
    LONGEST = "longest"
    MAX_LENGTH = "max_length"

    @classmethod
    def _missing_(cls, value):
        raise ValueError(f"{value} is not a valid padding")


class _AddsOne:
    def __call__(self, x):
        return x + 1


def values_of_the_library(x):
    ref = weakref.ref(x)
    pad = _Padding("longest")
    try:
        _Padding("nope")
    except ValueError:
        x = x * 2
    path = os.fspath(pathlib.Path("a") / "b")
    return ref() * 3, pad is _Padding.LONGEST, path, os.fspath("."), _AddsOne()(x)


def test_library_values_one_graph():
    check_graphs(values_of_the_library, t(3), graphs=1, fullgraph=True)


def test_weakref_passed_in_is_dereferenced_and_guarded():
    def fn(ref, y):
        target = ref()
        return torch.sin(y) if target is None else y + target

    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    w, y = t(3), t(3)
    ref = weakref.ref(w)
    torch.testing.assert_close(compiled(ref, y), y + w)
    del w
    gc.collect()
    torch.testing.assert_close(compiled(ref, y), torch.sin(y))  # the referent died: recompiled
    assert counter.frame_count == 2


def test_weakref_made_in_frame_is_returned_as_one():
    x = t(2)
    out, ref = kiln.compile(lambda a: (a + 1, weakref.ref(a)), backend=CompileCounter(), fullgraph=True)(x)
    assert ref() is x


# ---- torch.distributions: classes written in Python, followed like user code ----------------------------------
def distribution_log_prob(loc, scale):
    normal = torch.distributions.Normal(loc, scale, validate_args=False)
    joint = torch.distributions.Independent(normal, 1, validate_args=False)
    return joint.log_prob(loc * 2), normal.mean, normal.stddev, joint.entropy()


def test_distribution_made_in_frame_one_graph():
    check_graphs(distribution_log_prob, t(3), torch.rand(3) + 0.5, graphs=1, fullgraph=True)


def test_distribution_argument_validation_still_raises():
    def fn(loc, scale):
        return torch.distributions.Normal(loc, scale).log_prob(loc)

    compiled = kiln.compile(fn, backend=CompileCounter())
    loc = t(3)
    torch.testing.assert_close(compiled(loc, torch.ones(3)), fn(loc, torch.ones(3)))
    with pytest.raises(ValueError):
        compiled(t(3), -torch.ones(3))  # a negative scale: eager's validation error


# ---- profiler labels: no computation, no break ------------------------------------------------------------------
def labelled_regions(x):
    y = x ** 2
    with torch.autograd.profiler.record_function("outer") as label:
        y = y + 2
        with torch.profiler.record_function("inner"):
            z = y ** 3
    return z + 1, label.name


def test_record_function_blocks_one_graph():
    check_graphs(labelled_regions, t(2, 2), graphs=1, fullgraph=True)


# ---- dict views passed in: live views of their dict -------------------------------------------------------------
def reads_dict_views(x, d, keys, values, items):
    if "c" in keys:
        x = x + d["c"]
    for k in keys:
        x = x + len(k)
    for _, v in items:
        x = x * v
    return x + sum(values), keys, list(values), len(items)


def test_dict_views_passed_in_one_graph_and_guarded_on_their_dict():
    counter = CompileCounter()
    compiled = kiln.compile(reads_dict_views, backend=counter, fullgraph=True)
    d = {"a": 1, "b": 2}
    for change in [None, ("c", 3), ("a", 5), None]:
        if change:
            d[change[0]] = change[1]  # a new key, then a new value: each recompiles
        x = t(2)
        got = compiled(x, d, d.keys(), d.values(), d.items())
        want = reads_dict_views(x, d, d.keys(), d.values(), d.items())
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:] and type(got[1]) is type(want[1])
    assert counter.frame_count == 3


def deque_extended_from_lazy_iterators(x):
    d = collections.deque([1])
    d.extendleft(map(lambda z: z + d[0], range(3)))  # each item sees the deque as it grows
    d.extend(filter(lambda z: z > d[-1] - 3, [0, 5, 1, 9]))
    return x + d[0], d


def test_deque_extended_item_by_item_from_lazy_iterators():
    # (was: the map drained before the first appendleft - a wrong deque)
    check_graphs(deque_extended_from_lazy_iterators, t(2), graphs=1, fullgraph=True)
