"""Constructs whose bytecode differs between CPython 3.11, 3.12 and 3.13, compiled vs eager.

Each program is ordinary Python; on each version it exercises that version's opcodes (3.12: inlined
comprehensions, LOAD_SUPER_ATTR, the method bit of LOAD_ATTR, BINARY_SLICE/STORE_SLICE, RETURN_CONST,
CALL_INTRINSIC_1, END_FOR, END_SEND; 3.13: LOAD_FAST_LOAD_FAST, STORE_FAST_LOAD_FAST,
STORE_FAST_STORE_FAST, TO_BOOL, CALL_KW, SET_FUNCTION_ATTRIBUTE, CONVERT_VALUE/FORMAT_*, the callable
before its NULL). Graph counts are torch.compile's; the whole suite runs on every version.
"""
import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_same, check_graphs


def comprehension_shadowing_argument(x, i):
    ys = [x * i for i in range(3)]          # 3.12+: inlined, `i` saved and restored around the loop
    return torch.stack(ys).sum(0) + i


def comprehension_shadowing_unbound(x):
    ys = [x + j for j in range(2)]          # `j` unbound before and after the comprehension
    zs = {k: x * k for k in (1, 2)}
    return ys[1] - zs[2]


def comprehension_with_condition_and_closure(x):
    scale = 2.0
    parts = [x * scale for n in range(4) if n % 2]

    def add(t):
        return t + scale                     # `scale` a cell: 3.13 loads it for the closure with LOAD_FAST
    return add(sum(parts))


def comprehension_over_a_cell(x):
    i = 10
    outer = lambda: i                        # noqa: E731 -- `i` is a cell of this frame
    fs = [lambda: x * i for i in range(3)]   # 3.12+: the comprehension gets its own cell for `i`
    return [f() for f in fs], outer() + x


def nested_comprehension(x):
    return sum(x[r] * c for r in range(2) for c in [r, r + 1])


class Base(torch.nn.Module):
    factor = 0.5

    def forward(self, x):
        return x * 2

    def scale(self, x, *, by=1.0):
        return x * by


class Child(Base):
    def forward(self, x):
        y = super().forward(x)               # 3.12+: LOAD_SUPER_ATTR with the method bit
        z = super(Child, self).scale(y, by=3.0)
        return z + super().factor            # LOAD_SUPER_ATTR, attribute form


def slices(x, lst):
    head = x[1:3]                            # 3.12+: BINARY_SLICE
    lst[0:2] = [head.sum(), head.mean()]     # 3.12+: STORE_SLICE
    return head * lst[1], lst[-1:]


def returns_const(x, flag: bool):
    if flag:
        return None                          # 3.12+: RETURN_CONST
    return x + 1


def keyword_and_star_calls(x, args, kwargs):
    y = torch.clamp(x, min=-0.5, max=0.5)    # 3.13: CALL_KW
    z = torch.add(*args, **kwargs)           # CALL_FUNCTION_EX, the NULL slot on each side of the callable
    w = torch.cat((y, z)).view(-1)
    return w.sum(dim=0, keepdim=True), torch.stack([*args, y])


def unary_plus_and_not(x, flag):
    y = +x                                   # 3.12+: CALL_INTRINSIC_1 UNARY_POSITIVE
    if not flag:                             # 3.13: TO_BOOL + UNARY_NOT
        y = y - 1
    a, b = b, a = y, x                       # 3.13: STORE_FAST_STORE_FAST
    return a * b


def fstrings(x, n):
    name = f"{n!r:>6}|{n:03d}|{n}|{n!s}|{'a'!a}"   # 3.13: CONVERT_VALUE, FORMAT_WITH_SPEC, FORMAT_SIMPLE
    return x * len(name)


def closures_with_defaults(x):
    k = 3

    def inner(t, scale=2.0, *, shift=k):     # 3.13: MAKE_FUNCTION + SET_FUNCTION_ATTRIBUTE
        return t * scale + shift + k
    return inner(x), inner(x, 0.5, shift=1)


def generator_with_yield_from(x):
    def parts(t):
        yield t + 1
        yield from (t * i for i in range(2))  # SEND / END_SEND (3.12+)
    return torch.stack(list(parts(x)))


def for_loop_end(x, items):
    total = x
    for v in items:                          # 3.12+: END_FOR (3.13: + POP_TOP) after the loop
        total = total + v
    for i, v in enumerate(items):
        if i == 1:
            break
        total = total * v
    return total


def truth_of_tensor_breaks(x):
    y = x.sin()
    if y.sum() > 0 and not (y.max() > 10):   # data-dependent: a graph break at the jump on each version
        return y + 1
    return y - 1


def method_call_breaks(x, obj):
    y = x.cos()
    n = obj.count(2)                         # a call that graph-breaks: the callable and its self slot
    return y * n


def keyword_call_breaks(x, obj):
    y = x.cos()
    n = obj.count(v=3)                       # 3.13: a graph break at CALL_KW
    return y * n


def star_call_breaks(x, obj, args):
    y = x.cos()
    n = obj.count(*args)                     # a graph break at CALL_FUNCTION_EX
    return y * n


def property_breaks(x, obj):
    y = x.sin()
    z = y * obj.noisy_scale                  # a graph break at LOAD_ATTR (the property prints)
    return obj.noisy_scaler(z) + 1           # ... at LOAD_ATTR with the method bit (3.12+) / LOAD_METHOD


class Counter:
    def __init__(self):
        self.calls = 0

    def count(self, v):
        print("native call", v)               # forces a graph break on every version
        self.calls += 1
        return v + self.calls

    @property
    def noisy_scale(self):
        print("reading a property")
        self.calls += 1
        return 2.0

    @property
    def noisy_scaler(self):
        print("reading a property")
        self.calls += 10
        return lambda t: t * self.calls


CASES = [
    (comprehension_shadowing_argument, lambda: (torch.randn(4), 5), 1),
    (comprehension_shadowing_unbound, lambda: (torch.randn(4),), 1),
    (comprehension_with_condition_and_closure, lambda: (torch.randn(4),), 1),
    (nested_comprehension, lambda: (torch.randn(3, 4),), 1),
    (comprehension_over_a_cell, lambda: (torch.randn(3),), 1),
    (slices, lambda: (torch.randn(5), [torch.ones(()), torch.zeros(()), torch.ones(())]), 1),
    (returns_const, lambda: (torch.randn(3), True), 0),
    (returns_const, lambda: (torch.randn(3), False), 1),
    (keyword_and_star_calls, lambda: (torch.randn(4), (torch.randn(4), torch.randn(4)), {"alpha": 2}), 1),
    (unary_plus_and_not, lambda: (torch.randn(4), False), 1),
    (fstrings, lambda: (torch.randn(4), 7), 1),
    (closures_with_defaults, lambda: (torch.randn(4),), 1),
    (generator_with_yield_from, lambda: (torch.randn(4),), 1),
    (for_loop_end, lambda: (torch.randn(4), [torch.randn(4), torch.randn(4), torch.randn(4)]), 1),
]


@pytest.mark.parametrize("fn,make_args,graphs", CASES, ids=[c[0].__name__ + str(i) for i, c in enumerate(CASES)])
def test_one_graph_like_eager(fn, make_args, graphs):
    torch.manual_seed(0)
    check_graphs(fn, *make_args(), graphs=graphs, fullgraph=True)


def test_super_calls_in_a_module():
    torch.manual_seed(0)
    mod = Child()
    counter = CompileCounter()
    compiled = kiln.compile(mod, backend=counter, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), mod(x))
    assert counter.frame_count == 1


def test_break_on_tensor_truth_resumes_each_way():
    compiled = kiln.compile(truth_of_tensor_breaks, backend=CompileCounter())
    for x in (torch.full((3,), 0.5), torch.full((3,), -0.5)):
        assert_same(truth_of_tensor_breaks, compiled, x)


BREAKS = [(method_call_breaks, (), 2), (keyword_call_breaks, (), 2), (star_call_breaks, ((5,),), 2),
          pytest.param(property_breaks, (), 3, marks=pytest.mark.torch_differs(
              "torch cannot break at an attribute load: it runs the whole frame eagerly"))]


@pytest.mark.parametrize("fn,extra,graphs", BREAKS,
                         ids=["method_call", "keyword_call", "star_call", "property"])
def test_break_keeps_the_call_slots(fn, extra, graphs):
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter)
    eager_obj, compiled_obj = Counter(), Counter()
    x = torch.randn(4)
    expected = fn(x, eager_obj, *extra)
    torch.testing.assert_close(compiled(x, compiled_obj, *extra), expected)
    assert compiled_obj.calls == eager_obj.calls
    assert counter.frame_count == graphs  # one more than the native parts


@pytest.mark.kiln_only
def test_fullgraph_names_the_construct():
    def reads_data(x):
        y = x * 2
        return y + y.data_ptr() % 2  # (tolist() is captured under fullgraph: test_data_scalars.py)
    with pytest.raises(kiln.Unsupported, match=r"Tensor.data_ptr\(\) needs the tensor's data.*reads_data|"
                                                r"Tensor.data_ptr\(\) needs the tensor's data.*y.data_ptr"):
        kiln.compile(reads_data, backend="eager", fullgraph=True)(torch.randn(2))
