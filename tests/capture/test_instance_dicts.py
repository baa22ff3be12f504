"""`obj.__dict__` of an object from outside the frame agrees with the frame's attribute writes and
deletes, made before or after the read, and attribute reads see writes made through the dict;
results and the object's state after the call match eager."""
import pytest
import torch

from tests.utils import check_graphs


class Record:
    def __init__(self):
        self.a = 1
        self.b = 2


def stores_then_reads_the_dict(obj, x):
    obj.c = 3
    obj.a = 10
    d = obj.__dict__
    return dict(d.items()), len(d), x + d["a"], "c" in d, sorted(d.keys()), list(d.values())


def deletes_then_reads_the_dict(obj, x):
    del obj.a
    return x * len(obj.__dict__), list(obj.__dict__)


def reads_the_dict_then_stores(obj, x):
    d = vars(obj)
    obj.e = 5
    del obj.b
    return x + len(d), list(d), d.get("e")


def writes_the_dict_then_reads_attributes(obj, x):
    obj.__dict__["z"] = 4
    obj.__dict__["a"] = 7
    return x + obj.z * obj.a, hasattr(obj, "z")


def iterates_the_dict_after_stores(obj, x):
    obj.total = 0
    for name, value in obj.__dict__.items():
        x = x + value
    return x, sorted(obj.__dict__)


_ORDER = pytest.mark.torch_differs("torch.compile 2.13 lists attributes set in the frame before the existing ones")


@pytest.mark.parametrize("fn", [pytest.param(stores_then_reads_the_dict, marks=_ORDER), deletes_then_reads_the_dict,
                                pytest.param(reads_the_dict_then_stores, marks=_ORDER),
                                writes_the_dict_then_reads_attributes, iterates_the_dict_after_stores],
                         ids=lambda f: f.__name__)
def test_instance_dict_agrees_with_attribute_writes(fn):
    check_graphs(fn, Record(), torch.ones(2), graphs=1, fullgraph=True)
