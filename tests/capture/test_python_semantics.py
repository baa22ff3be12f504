"""Python semantics that a symbolic interpreter easily gets subtly wrong: mutable defaults, class
attributes, escaping closures, decorators, enums, namedtuples, asserts, errors from tensor ops."""
import collections
import enum
import functools
import typing

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs

PROJECTION = torch.nn.Linear(3, 3)
Point = collections.namedtuple("Point", ["x", "y"])


class Mode(enum.Enum):
    FAST = "fast"
    EXACT = "exact"


class Registry:
    created = 0


class Lazy:
    """Attribute access that goes through a user __getattr__."""

    def __init__(self, scale):
        self._values = {"scale": scale}

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1
    return wrapper


@logged
def decorated(x, scale=2.0):
    return x * scale


def uses_mutable_default(x, acc=[]):  # noqa: B006  (the shared default is the point)
    acc.append(1)
    return x * len(acc)


def test_mutable_default_grows_across_calls():
    compiled = kiln.compile(uses_mutable_default, backend=CompileCounter())
    x = torch.ones(2)
    uses_mutable_default.__defaults__[0].clear()
    outs = [compiled(x) for _ in range(3)]
    assert [o[0].item() for o in outs] == [1.0, 2.0, 3.0]
    assert uses_mutable_default.__defaults__[0] == [1, 1, 1]


def test_class_attribute_mutation():
    def f(x):
        Registry.created += 1
        return x * Registry.created
    start = Registry.created
    compiled = kiln.compile(f, backend=CompileCounter())
    torch.testing.assert_close(compiled(torch.ones(1)), torch.ones(1) * (start + 1))
    torch.testing.assert_close(compiled(torch.ones(1)), torch.ones(1) * (start + 2))
    assert Registry.created == start + 2


def test_escaping_closure_works_after_the_call():
    def f(x):
        k = x.sum()

        def scale(t):
            return t * k
        return scale, x + 1
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.ones(3)
    scale, y = compiled(x)
    torch.testing.assert_close(scale(torch.ones(2)), torch.full((2,), 3.0))
    torch.testing.assert_close(y, x + 1)


def namedtuple_roundtrip(x):
    p = Point(x, x * 2)
    q = p._replace(y=p.y + 1)
    return Point(*q), q.x + q[1]


def enum_dispatch(x):
    mode = Mode("fast")
    if mode is Mode.FAST and mode.value == "fast":
        return x.half().float()
    return x


def ordered_dict_ops(x):
    d = collections.OrderedDict(a=x, b=x * 2)
    d.move_to_end("a")
    return list(d.values())[0], list(d)


def defaultdict_ops(x):
    d = collections.defaultdict(list)
    d["k"].append(x)
    d["k"].append(x + 1)
    return sum(d["k"]), len(d)


def typing_cast_and_optional(x: torch.Tensor, y: typing.Optional[torch.Tensor] = None):
    x = typing.cast(torch.Tensor, x)
    return x * 2 if y is None else x + y


def decorated_call(x):
    return decorated(x, scale=3.0) + decorated(x)


def user_getattr(x):
    return x * Lazy(4.0).scale


def passing_assert_on_metadata(x):
    assert x.dim() == 2, "expects a matrix"
    assert isinstance(x, torch.Tensor)
    return x.t()


def is_comparisons(x):
    y = x
    z = x.clone()
    return x * (y is x) + x * (z is not x) + (x is None)


def deleted_local(x):
    tmp = x * 2
    out = tmp + 1
    del tmp
    tmp = out.sum()
    return out, tmp


def builtins_over_containers(x):
    names = ["b", "a", "c"]
    pairs = dict(zip(names, range(3)))
    order = [k for k, _ in sorted(pairs.items(), key=lambda kv: kv[0])]
    return x * pairs["c"] + len(list(reversed(order))) + tuple(order).index("b")


def parameter_isinstance(x):
    p = PROJECTION.weight
    return x * p if isinstance(p, torch.nn.Parameter) and isinstance(p, torch.Tensor) else x


CASES = [namedtuple_roundtrip, enum_dispatch, ordered_dict_ops, defaultdict_ops, typing_cast_and_optional,
         decorated_call, user_getattr, passing_assert_on_metadata, is_comparisons, deleted_local,
         builtins_over_containers, parameter_isinstance]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_semantics_one_graph(fn):
    check_graphs(fn, torch.randn(3, 3), graphs=1)


def test_failing_assert_raises_assertion_error():
    compiled = kiln.compile(passing_assert_on_metadata, backend=CompileCounter())
    with pytest.raises(AssertionError, match="expects a matrix"):
        compiled(torch.randn(3))


def test_shape_error_in_tensor_op_raises_runtime_error():
    def f(x, y):
        return x + y
    compiled = kiln.compile(f, backend=CompileCounter())
    with pytest.raises(RuntimeError):
        compiled(torch.randn(3), torch.randn(4))
    torch.testing.assert_close(compiled(torch.ones(3), torch.ones(3)), torch.full((3,), 2.0))


def test_python_error_in_region_has_eager_type():
    def f(x, d):
        return x * d["missing"]
    compiled = kiln.compile(f, backend=CompileCounter())
    with pytest.raises(KeyError):
        compiled(torch.randn(3), {})
