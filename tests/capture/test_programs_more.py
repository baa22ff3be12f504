"""Realistic programs, each called several times eagerly and compiled with changing inputs (shapes,
dtypes, Python values, flags), so guards and recompiles are exercised: results, exceptions, the
arguments afterwards and outside state (globals, RNG) must match eager, and the graph counts are the
ones torch.compile gives (KILN_TEST_PEER=torch)."""
import collections
import dataclasses
import enum
import functools
import itertools
import math
import operator
from typing import NamedTuple

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_calls

t = torch.randn


# ---- Python features ----------------------------------------------------------------------------
def closure_nonlocal(x, n):
    acc = 0

    def add(v):
        nonlocal acc
        acc += v
        return acc
    for i in range(n):
        add(i)
    return x * acc, acc


def _kw_target(x, scale=2.0, *, shift=1, **kw):
    return x * scale + shift + kw.get("extra", 0)


def defaults_and_keyword_only(x, s):
    return _kw_target(x, s, shift=3, extra=1), _kw_target(x), _kw_target(x, shift=s)


def _varargs_target(*xs, **kws):
    out = sum(xs[1:], xs[0])
    for _, v in sorted(kws.items()):
        out = out * v
    return out


def varargs(a, b):
    return _varargs_target(a, b, a, z=2, y=3), _varargs_target(b)


def comprehensions(x):
    parts = [x[i] * i for i in range(x.shape[0])]
    d = {f"k{i}": p for i, p in enumerate(parts)}
    s = {i % 2 for i in range(5)}
    g = sum(p.sum() for p in parts)
    return torch.stack(parts), d, len(s), g, any(p.dim() == 1 for p in parts), all(i > -1 for i in s)


def iteration_builtins(x, ys):
    z = [a * b for a, b in zip(ys, reversed(ys))]
    m = list(map(lambda v: v + 1, z))
    f = list(filter(lambda v: v.shape[0] > 1, m))
    idx = sorted(range(len(ys)), key=lambda i: -i)
    e = [(i, v.sum()) for i, v in enumerate(ys, 1)]
    e2 = list(enumerate("ab", start=5))
    return x + sum(f), idx, e, e2, max(3, len(ys)), min([2, 1, 5])


def strings_and_fstrings(x, name):
    key = f"{name}_{x.shape[0]}:{x.dtype}"
    parts = key.split("_")
    up = name.upper().strip().replace("A", "b")
    return x * len(key), parts, up, name.startswith("a"), "-".join([name, str(x.dim())]), f"{3.14159:.2f}"


def math_operator_itertools(x, k):
    a = math.sqrt(k) + math.log(k) + math.pi + math.floor(2.5) + math.ceil(k / 3)
    b = operator.mul(x, a)
    c = functools.partial(torch.add, alpha=2)(b, x)
    return (c, list(itertools.chain([1, 2], [3])), list(itertools.product([1, 2], repeat=2)), abs(-k),
            divmod(k, 3), round(a, 2))


@dataclasses.dataclass
class Cfg:
    scale: float
    bias: bool = True
    name: str = "x"


def dataclass_input(x, cfg):
    y = x * cfg.scale
    if cfg.bias:
        y = y + 1
    return y


def dataclass_output(x):
    return Cfg(scale=x * 2, bias=False)


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


def namedtuple_in_and_out(p):
    q = Pair(p.a + p.b, p.b * 2)
    return q._replace(a=q.a.sum()), q.b, p[0]


class Color(enum.Enum):
    RED = 1
    GREEN = 2


def enum_dispatch(x, c):
    if c is Color.RED:
        return x + 1
    if c == Color.GREEN:
        return x * c.value
    return x


class Base:
    factor = 2

    def __init__(self, w):
        self.w = w

    def apply(self, x):
        return x * self.factor

    @staticmethod
    def st(x):
        return x + 1

    @classmethod
    def cm(cls, x):
        return x * cls.factor


class Child(Base):
    factor = 3

    def apply(self, x):
        return super().apply(x) + self.w


def classes_and_super(x):
    c = Child(1.0)
    return c.apply(x), Child.st(x), Child.cm(x), Base.cm(x), isinstance(c, Base), type(c).__name__


def exceptions_caught(x, k):
    try:
        if k > 2:
            raise ValueError("big")
        y = x + 1
    except ValueError:
        y = x - 1
    finally:
        y = y * 2
    try:
        d = {}["missing"]
    except KeyError:
        d = 5
    return y + d


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


def recursion(x, n):
    return x * _fact(n)


def early_return(x, flag):
    if flag:
        return x + 1
    if x.shape[0] > 3:
        return x * 2
    return x - 1


def while_loop(x, n):
    i = 0
    while i < n:
        x = x * 1.5
        i += 1
    return x


def dict_ops(x, d):
    d = dict(d)
    d["z"] = x
    d.update(w=x * 2)
    keys = list(d.keys())
    v = d.pop("a")
    s = set(keys) - {"z"}
    return v + d["z"], sorted(s), tuple(d), len(d), "w" in d, d.get("q", 3)


def mutates_its_arguments(x, lst, d):
    lst.append(x * 2)
    lst[0] = lst[0] + 1
    d["new"] = x.sum()
    del d["old"]
    return x


def sorted_with_lambda_key(x, items):
    items = sorted(items, key=lambda kv: kv[1], reverse=True)
    return x * items[0][1], items


class HasScale:
    scale = 3.0


class HasBias:
    def __init__(self):
        self.bias = 1


def getattr_hasattr_default(x, obj):
    s = getattr(obj, "scale", 1.0)
    return x * s + (1 if hasattr(obj, "bias") else 0)


def generator_into_tuple_and_max(xs):
    total = tuple(x.shape[0] for x in xs)
    m = max(x.shape[0] for x in xs)
    padded = [torch.nn.functional.pad(x, (0, m - x.shape[0])) for x in xs]
    return torch.stack(padded), total


def itertools_pairs(xs):
    acc = 0
    for i, j in itertools.combinations(range(len(xs)), 2):
        acc = acc + xs[i] * xs[j]
    acc2 = [a + b for a, b in itertools.zip_longest(xs, xs[1:], fillvalue=0)]
    return acc, acc2, list(itertools.accumulate([1, 2, 3])), list(itertools.islice(range(10), 2, 5))


def _kw_only(x, *, a, b=2, **rest):
    return x * a + b + len(rest)


def keyword_unpacking(x, kw):
    return _kw_only(x, **kw), _kw_only(x, a=1, **{"z": 1})


def star_unpacking(x):
    a, *rest = x.unbind(0)
    *init, last = [1, 2, 3]
    first, (second, third) = 1, (2, 3)
    return a + sum(rest), init, last, first + second + third


def isinstance_dispatch(x, y):
    if isinstance(y, torch.Tensor):
        return x + y
    if isinstance(y, (list, tuple)):
        return x + sum(y)
    if isinstance(y, (int, float)):
        return x * y
    return x


def try_attribute_error(x, obj):
    try:
        s = obj.scale
    except AttributeError:
        s = 1.0
    return x * s


def closures_from_a_factory(x):
    def make(k):
        return lambda v: v * k
    return [f(x) for f in [make(i) for i in range(3)]]


def string_parsing(x, s):
    parts = s.split(",")
    n = int(parts[0]) + float(parts[1])
    return x * n, s.lower(), s.join(["a", "b"]), s.count(","), s[::-1]


PY_CASES = [
    (closure_nonlocal, [(t(3), 3), (t(3), 4), (t(4, 2), 4)]),
    (defaults_and_keyword_only, [(t(3), 2.0), (t(3), 3.0), (t(2), 3.0)]),
    (varargs, [(t(3), t(3)), (t(4), t(4))]),
    (comprehensions, [(t(3, 2),), (t(4, 2),)]),
    (iteration_builtins, [(t(3), [t(3), t(3)]), (t(3), [t(3), t(3), t(3)])]),
    (strings_and_fstrings, [(t(3), "abc"), (t(4), "abc"), (t(4), "xyz")]),
    (math_operator_itertools, [(t(3), 4), (t(3), 5)]),
    (dataclass_input, [(t(3), Cfg(2.0)), (t(3), Cfg(3.0, False)), (t(3), Cfg(3.0, True))]),
    (dataclass_output, [(t(3),), (t(4),)]),
    (namedtuple_in_and_out, [(Pair(t(3), t(3)),), (Pair(t(2), t(2)),)]),
    (enum_dispatch, [(t(3), Color.RED), (t(3), Color.GREEN), (t(3), Color.RED)]),
    (classes_and_super, [(t(3),), (t(4),)]),
    (exceptions_caught, [(t(3), 1), (t(3), 3)]),
    (recursion, [(t(3), 4), (t(3), 5)]),
    (early_return, [(t(3), True), (t(3), False), (t(5), False)]),
    (while_loop, [(t(3), 3), (t(3), 0), (t(3), 5)]),
    (dict_ops, [(t(3), {"a": t(3), "b": 1}), (t(3), {"a": t(3), "b": 2})]),
    (mutates_its_arguments, [(t(3), [t(3)], {"old": 1}), (t(3), [t(3), 1], {"old": 1, "k": 2})]),
    (sorted_with_lambda_key, [(t(3), [("a", 2), ("b", 5)]), (t(3), [("a", 9), ("b", 5)])]),
    (getattr_hasattr_default, [(t(3), HasScale()), (t(3), HasBias()), (t(3), HasScale())]),
    (generator_into_tuple_and_max, [([t(2), t(4)],), ([t(3), t(5), t(1)],)]),
    (itertools_pairs, [([t(2), t(2), t(2)],)]),
    (keyword_unpacking, [(t(3), {"a": 2}), (t(3), {"a": 2, "b": 5, "c": 0})]),
    (star_unpacking, [(t(4, 2),), (t(3, 2),)]),
    (isinstance_dispatch, [(t(3), t(3)), (t(3), [1, 2]), (t(3), 2.5), (t(3), (t(3),)), (t(3), None)]),
    (try_attribute_error, [(t(3), HasScale()), (t(3), HasBias())]),
    (closures_from_a_factory, [(t(2),), (t(3),)]),
    (string_parsing, [(t(3), "1,2.5"), (t(3), "3,1")]),
]


@pytest.mark.parametrize("fn, calls", PY_CASES, ids=[c[0].__name__ for c in PY_CASES])
def test_python_program(fn, calls):
    counter = check_calls(fn, calls)
    assert counter.frame_count >= 1  # captured, not left to run eagerly


# ---- regressions: each found by a program above, fixed in capture ---------------------------------
def test_size_method_returns_torch_size():
    def f(x):
        return x.size(), x.shape, x.stride()
    check_calls(f, [(t(3, 4),), (t(5, 4),), (t(6, 4),)])


def test_slice_bounds_from_dynamic_sizes_stay_in_the_graph():
    def f(x):
        n, d = x.shape
        out = x.new_zeros(n, d * 2)
        out[:, :d] = x
        return out[: n - 1], x[1:n], out.view(n, 2, d).sum(1)
    # static first call, then one recompile with the changed size symbolic; no eager fallback
    check_calls(f, [(t(3, 4),), (t(5, 4),), (t(6, 4),), (t(7, 4),)], graphs=2)


def _needs_1d(x):
    assert x.dim() == 1, "need 1d"
    return x * 2


def test_a_call_that_raises_does_not_leave_the_function_eager():
    counter = CompileCounter()
    compiled = kiln.compile(_needs_1d, backend=counter)
    compiled(t(3))
    with pytest.raises(AssertionError, match="need 1d"):
        compiled(t(3, 2))
    for n in (5, 6):
        torch.testing.assert_close(compiled(torch.ones(n)), torch.full((n,), 2.0))
    assert counter.frame_count == 2  # the first shape, then the size made dynamic


def test_exception_raised_in_a_helper_propagates_each_call():
    def f(x, k):
        return x + _needs_1d(x) * k
    check_calls(f, [(t(3), 1), (t(3, 2), 1), (t(4), 2), (t(3, 3), 2), (t(5), 2)])


def test_itertools_over_tensors():
    def f(xs, ys):
        pairs = [a * b for a, b in itertools.product(xs, ys)]
        perm = [a - b for a, b in itertools.permutations(xs, 2)]
        chained = sum(itertools.chain(xs, ys))
        flat = list(itertools.chain.from_iterable([xs, ys]))
        firsts = list(itertools.islice(ys, 1))
        adj = [b - a for a, b in itertools.pairwise(xs)]
        running = list(itertools.accumulate(xs, torch.maximum))
        return pairs, perm, chained, flat, firsts, adj, running
    check_calls(f, [([t(2), t(2)], [t(2), t(2), t(2)]), ([t(2), t(2), t(2)], [t(2)])], graphs=2)
