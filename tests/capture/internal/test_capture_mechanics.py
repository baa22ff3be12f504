"""Capture mechanics that the black-box suite reaches only indirectly."""
import collections

import pytest
import torch

import kiln
from tests.utils import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def test_dynamic_size_turned_into_python_int_is_pinned():
    # produce_guards leaves out sizes that became plain ints; without the pin the second call
    # would reuse the first entry and return the old size
    def f(x):
        n = x.size(0)
        return x * n, n
    compiled = kiln.compile(f, backend=CompileCounter(), dynamic=True)
    for size in (2, 3, 5):
        out, n = compiled(torch.ones(size))
        assert n == size and out.tolist() == [float(size)] * size


def test_side_effects_are_replayed_before_the_breaking_call_sees_them():
    log = []

    def f(x, state):
        state["seen"] = 1
        log.append(dict(state))  # a native call at a break: must see the store above
        return x + state["seen"]
    compiled = kiln.compile(f, backend=CompileCounter())
    state = {}
    assert compiled(torch.zeros(1), state).item() == 1.0
    assert log == [{"seen": 1}] and state == {"seen": 1}


def test_model_output_like_dict_is_rebuilt_with_its_class():
    from transformers.utils import ModelOutput
    import dataclasses

    @dataclasses.dataclass
    class Out(ModelOutput):
        a: torch.Tensor = None
        b: torch.Tensor = None

    def f(x):
        out = Out(a=x + 1)
        return out, out[0] * 2, out.b is None
    counter = CompileCounter()
    result, doubled, b_none = kiln.compile(f, backend=counter)(torch.ones(2))
    assert isinstance(result, Out) and list(result.keys()) == ["a"] and b_none
    assert doubled.tolist() == [4.0, 4.0] and counter.frame_count == 1


def test_grad_mode_blocks_switch_in_the_graph():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y, x * 3
    counter = CompileCounter()
    y, z = kiln.compile(f, backend=counter)(torch.ones(2, requires_grad=True))
    assert not y.requires_grad and z.requires_grad and counter.frame_count == 1


def test_ordered_dict_keeps_its_type():
    def f(x):
        d = collections.OrderedDict(a=x)
        d["b"] = x * 2
        d.move_to_end("a")
        return d
    out = kiln.compile(f, backend=CompileCounter())(torch.ones(1))
    assert type(out) is collections.OrderedDict and list(out) == ["b", "a"]


class Box:
    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return f"Box({self.v})"


def test_objects_guarded_by_type_are_not_folded_whole():
    # only type(box) is guarded, so repr(box) must not be baked into the entry
    def f(x, box):
        return x + len(repr(box))
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.zeros(1)
    assert compiled(x, Box(1)).item() == len("Box(1)")
    assert compiled(x, Box(12345)).item() == len("Box(12345)")


class Scaler:
    factor = 2.0

    def apply(self, x):
        return x * self.factor


def test_class_attribute_change_is_not_stale():
    def f(x):
        return Scaler().apply(x)  # a new object: `factor` comes from the class
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.ones(1)
    assert compiled(x).item() == 2.0
    Scaler.factor = 5.0
    try:
        assert compiled(x).item() == 5.0
    finally:
        Scaler.factor = 2.0


def test_node_names_of_one_op_repeated_take_linear_work():
    """A graph of thousands of one op (a loop of `x = 1.0 * x`) names each node in a few probes of
    the taken names, not by trying every name taken before it (quadratic: such graphs took minutes)."""
    from kiln.capture.graph_builder import OutputGraph

    class CountingSet(set):
        probes = 0

        def __contains__(self, name):
            CountingSet.probes += 1
            return super().__contains__(name)
    og = OutputGraph("f")
    og._names = CountingSet()
    names = [og._unique("mul") for _ in range(2000)] + [og._unique("mul_5"), og._unique("add")]
    assert len(set(names)) == len(names) and names[:3] == ["mul", "mul_1", "mul_2"]
    assert CountingSet.probes < 3 * len(names)
