"""User classes: methods, super(), properties, classmethod/staticmethod, instances created and
mutated inside the region, attribute get/set on objects passed in (state after the call as eager)."""
import dataclasses
import enum
import sys

import pytest
import torch

import kiln
from tests.utils import check_graphs


class Base:
    factor = 2.0

    def __init__(self, bias):
        self.bias = bias

    def apply(self, x):
        return x * self.factor + self.bias

    @property
    def doubled_bias(self):
        return self.bias * 2

    @classmethod
    def make(cls, bias):
        return cls(bias)

    @staticmethod
    def shift(x):
        return x - 1


class Child(Base):
    factor = 3.0

    def apply(self, x):
        return super().apply(x) + 10


class Counter:
    def __init__(self):
        self.calls = 0
        self.history = []

    def step(self, x):
        self.calls += 1
        self.history.append(self.calls)
        return x + self.calls


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: float = 1.0

    def total(self):
        return self.a * self.b


class Dunder:
    def __init__(self, v):
        self.v = v

    def __add__(self, other):
        return Dunder(self.v + other.v)

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return self.v * i


def method_call(x):
    return Base(1.0).apply(x)


def super_call(x):
    return Child(0.5).apply(x)


def property_access(x):
    return x + Base(2.0).doubled_bias


def classmethod_and_staticmethod(x):
    obj = Child.make(1.5)
    return Base.shift(obj.apply(x)), obj.shift(x)


def class_attribute_read(x):
    return x * Child.factor + Base.factor


def instance_created_and_mutated(x):
    c = Counter()
    x = c.step(x)
    x = c.step(x)
    return x * c.calls, list(c.history)


def instance_attribute_holds_tensor(x):
    p = Pair(x.sin())
    p.b = 4.0
    return p.total()


def dunder_methods(x):
    d = Dunder(x) + Dunder(x * 2)
    return d[len(d)]


def bound_method_as_value(x):
    f = Base(0.0).apply
    return f(x)


def type_of_instance_dispatch(x):
    objs = [Base(1.0), Child(1.0)]
    return [o.apply(x) for o in objs if type(o) is Child or isinstance(o, Base)]


CASES = [method_call, super_call, property_access, classmethod_and_staticmethod, class_attribute_read,
         instance_created_and_mutated, instance_attribute_holds_tensor, dunder_methods, bound_method_as_value,
         type_of_instance_dispatch]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_user_classes_one_graph(fn):
    check_graphs(fn, torch.randn(2, 3), graphs=1)


def test_object_argument_mutated_as_eager():
    def f(x, counter):
        return counter.step(x) * 2
    check_graphs(f, torch.randn(3), Counter(), graphs=1)


def test_object_argument_attribute_set_to_tensor():
    def f(x, pair):
        pair.a = x * 3
        pair.b = pair.b + 1
        return pair.total()
    check_graphs(f, torch.randn(3), Pair(torch.zeros(3)), graphs=1)


def test_new_attribute_on_object_argument():
    class Box:
        pass

    def f(x, box):
        box.cached = x.cos()
        return box.cached + 1
    check_graphs(f, torch.randn(3), Box(), graphs=1)


def test_method_of_object_argument():
    def f(x, obj):
        return obj.apply(x) + obj.doubled_bias
    check_graphs(f, torch.randn(3), Child(torch.ones(3)), graphs=1)


class _Slots(enum.IntEnum):
    _FIRST = 0

    @classmethod
    @property
    def FIRST(cls):  # a class-level property (classmethod over property, Python 3.9-3.12)
        return cls._FIRST


class _Scaled:
    @classmethod
    @property
    def scale(cls):
        return 3


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="classmethod no longer wraps descriptors")
def test_classmethod_over_property_reads_the_value():
    def fn(x):
        y = x[..., _Slots.FIRST].tanh()
        return (y * _Scaled.scale + _Scaled().scale) if _Slots.FIRST == 0 else -y

    # (was the bound method: an error indexing with it, a wrong branch comparing it)
    check_graphs(fn, torch.randn(3, 2), graphs=1, fullgraph=True)


@dataclasses.dataclass
class _Shadowed:
    value: torch.Tensor
    edges: torch.Tensor

    @property
    def edges(self):  # noqa: F811 (the property shadows the field: the dataclass __init__ cannot set it)
        return self.value * 2


def test_setting_a_property_without_setter_raises_pythons_error():
    def fn(x):
        return _Shadowed(value=x, edges=x).value.sum()

    with pytest.raises(AttributeError, match="property 'edges' of '_Shadowed' object has no setter"):
        fn(torch.randn(3))
    with pytest.raises(Exception, match="property 'edges' of '_Shadowed' object has no setter"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(3))
    with pytest.raises(AttributeError, match="property 'edges' of '_Shadowed' object has no setter"):
        kiln.compile(fn, backend="eager")(torch.randn(3))


class _Registry:
    """Item protocol written in Python: `r[k] = v`, `del r[k]` and `r[k]` run these methods."""

    def __init__(self):
        self.slots, self.log = {}, []

    def __setitem__(self, key, value):
        self.log.append(("set", key))
        self.slots[key] = value * 2

    def __delitem__(self, key):
        self.log.append(("del", key))
        del self.slots[key]

    def __getitem__(self, key):
        return self.slots[key] + 1

    def __len__(self):
        return len(self.slots)


@pytest.mark.parametrize("made_inside", [False, True])
def test_item_assignment_and_deletion_run_the_classes_methods(made_inside):
    def fn(x, reg):
        reg = _Registry() if made_inside else reg
        reg["a"] = x
        reg["b"] = x.sin()
        del reg["a"]
        return reg["b"] * len(reg), reg.log

    # (was a graph break at each `reg[k] = v`, and the frame eager from `del reg[k]` on)
    check_graphs(fn, torch.randn(3), _Registry(), graphs=1, fullgraph=True)
