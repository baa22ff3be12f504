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


def match_statement(x):
    config = {"kind": "scale", "by": 3}
    match config:
        case {"kind": "shift", "by": amount}:
            return x + amount
        case {"kind": "scale", "by": amount}:
            return x * amount
        case _:
            return x


def match_on_shape(x):
    match tuple(x.shape):
        case (n, m) if n == m:
            return x.t()
        case (n, _):
            return x * n
    return x


def import_inside_function(x):
    import math as m
    from operator import mul
    return mul(x, m.tau)


def late_binding_closures(x):
    fns = [lambda t: t * i for i in range(3)]
    bound = [lambda t, i=i: t * i for i in range(3)]
    return [f(x) for f in fns], [f(x) for f in bound]


def multiple_star_unpacking(x):
    a, b = (x,), [x * 2]
    kw1, kw2 = {"dim": 0}, {"keepdim": True}
    return torch.cat([*a, *b], **kw1).sum(0, **kw2, **{}), [*a, *b, *(x + 1,)]


def diamond_inheritance(x):
    class A:
        def f(self, t):
            return t + 1

    class B(A):
        def f(self, t):
            return super().f(t) * 2

    class C(A):
        def f(self, t):
            return super().f(t) - 3

    class D(B, C):
        def f(self, t):
            return super().f(t) / 4
    return D().f(x), [k.__name__ for k in D.__mro__]


def slots_and_property_setter(x):
    holder = SlottedHolder(x)
    holder.value = holder.value * 5
    return holder.value, holder.sets


def while_else_and_for_else_break(x):
    i = 0
    while i < 3:
        i += 1
    else:
        x = x + i
    for j in range(5):
        if j == 2:
            break
    else:
        x = x * 100
    return x + j


def iterator_protocol(x):
    it = iter([x, x * 2, x * 3])
    first = next(it)
    rest = list(it)
    return first + sum(rest), next(iter([]), x)


def dict_merge_and_fromkeys(x):
    a = {"p": 1, "q": 2}
    b = a | {"q": 20, "r": 30}
    c = dict.fromkeys(["u", "v"], 0.5)
    return x * b["q"] + sum(c.values()) + len(b)


def min_max_with_key_and_zip_transpose(x):
    pairs = [(3, "c"), (1, "a"), (2, "b")]
    lo = min(pairs, key=lambda p: p[0])
    hi = max(pairs, key=lambda p: p[1])
    cols = list(zip(*pairs))
    return x * lo[0] + hi[0] + sum(cols[0])


def context_manager_without_break(x):
    with UserContext() as ctx:
        y = x * ctx.factor
    return y + ctx.exits


def exception_caught_inside_region(x):
    try:
        raise ValueError("handled")
    except ValueError as e:
        msg = str(e)
    finally:
        x = x + 1
    return x * len(msg)


def no_grad_decorated_helper(x):
    return grad_free_double(x) + x


def float_specials(x):
    return x.clamp(max=math_inf()) + (float("inf") > 1e308) + (-0.0 == 0.0)


def fstring_conversions(x):
    s = f"{'a'!r}{3:>4}{2.5:08.3f}{[1, 2]}"
    return x + len(s)


class SlottedHolder:
    __slots__ = ("_value", "sets")

    def __init__(self, v):
        self._value, self.sets = v, 0

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v):
        self.sets += 1
        self._value = v


class UserContext:
    def __init__(self):
        self.factor, self.exits = 3, 0

    def __enter__(self):
        self.factor += 1
        return self

    def __exit__(self, *exc):
        self.exits += 1
        return False


@torch.no_grad()
def grad_free_double(t):
    return t * 2


def math_inf():
    import math
    return math.inf


MORE_CASES = [match_statement, match_on_shape, import_inside_function, late_binding_closures, multiple_star_unpacking,
              slots_and_property_setter, while_else_and_for_else_break, iterator_protocol, dict_merge_and_fromkeys,
              min_max_with_key_and_zip_transpose, context_manager_without_break, exception_caught_inside_region,
              no_grad_decorated_helper, float_specials, fstring_conversions]


@pytest.mark.parametrize("fn", MORE_CASES, ids=[f.__name__ for f in MORE_CASES])
def test_more_semantics_one_graph(fn):
    check_graphs(fn, torch.randn(3, 3, requires_grad=fn is no_grad_decorated_helper), graphs=1)


def test_class_defined_inside_region_with_diamond_mro():
    check_graphs(diamond_inheritance, torch.randn(3))


class AttrDict(dict):
    """A dict subclass with attribute access, like Hugging Face's ModelOutput."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TensorList(list):
    def total(self):
        return sum(self)


def dict_subclass_output(x):
    out = AttrDict(hidden=x * 2)
    out["logits"] = out.hidden.sum(-1)
    return out


def list_subclass_methods(x):
    items = TensorList([x, x + 1])
    items.append(x * 3)
    return items.total(), len(items)


@pytest.mark.parametrize("fn", [dict_subclass_output, list_subclass_methods], ids=lambda f: f.__name__)
def test_container_subclasses_one_graph(fn):
    check_graphs(fn, torch.randn(2, 3), graphs=1)


def test_dict_subclass_returned_keeps_its_type():
    out = kiln.compile(dict_subclass_output, backend=CompileCounter())(torch.ones(2, 3))
    assert type(out) is AttrDict and list(out) == ["hidden", "logits"]


def test_exception_from_inlined_call_caught_in_region():
    def g(t):
        if t.dim() == 1:
            raise KeyError("one dim")
        return t

    def f(x):
        try:
            return g(x) * 2
        except KeyError:
            return x + 1
    check_graphs(f, torch.randn(3), graphs=1)
