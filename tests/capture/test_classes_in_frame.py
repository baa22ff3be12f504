"""Classes made inside the compiled frame (class statements, namedtuple(), dataclasses,
typing.NamedTuple, type(name, bases, ns)) and other constructs that made a frame run eagerly:
grad-mode decorators applied in the frame, @contextlib.contextmanager, TorchScript's hooks."""
import collections
import contextlib
import dataclasses
import typing

import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_same, check_graphs


def t(*shape):
    return torch.randn(*shape)


def namedtuple_made_in_frame(x):
    Point = collections.namedtuple("Point", ["a", "b"], defaults=[2])
    p = Point(x)
    return p.a * p.b, p._replace(b=3).b, Point._fields


def class_statement(x):
    class Scaler:
        factor = 3

        def __init__(self, v):
            self.v = v

        def scaled(self):
            return self.v * self.factor

    return Scaler(x).scaled(), Scaler.__name__


def dataclass_made_in_frame(x):
    @dataclasses.dataclass(frozen=True)
    class Pair:
        a: torch.Tensor
        b: int = 2

    p = Pair(x)
    return p.a + p.b, dataclasses.fields(Pair)[1].name


def typing_namedtuple_class(x):
    class Entry(typing.NamedTuple):
        a: int
        b: int = 5

    return x + Entry(1).b


def three_argument_type(x):
    Box = type("Box", (), {"size": 4})
    return x * Box.size


_OFFSET = 1


def class_body_reads_a_global(x):
    class Shifted:
        offset = _OFFSET

    return x + Shifted.offset


def class_closes_over_a_local(x):
    k = 5

    class UsesK:
        def get(self):
            return k

    return x * UsesK().get()


@pytest.mark.parametrize("fn", [namedtuple_made_in_frame, class_statement, dataclass_made_in_frame,
                                typing_namedtuple_class, three_argument_type, class_body_reads_a_global,
                                class_closes_over_a_local])
def test_class_made_in_frame_one_graph(fn):
    check_graphs(fn, t(3), graphs=1, fullgraph=True)


def test_a_global_the_class_body_read_is_guarded():
    global _OFFSET
    counter = CompileCounter()
    compiled = kiln.compile(class_body_reads_a_global, backend=counter, fullgraph=True)
    x = t(2)
    assert_same(class_body_reads_a_global, compiled, x)
    _OFFSET = 10
    try:
        assert_same(class_body_reads_a_global, compiled, x)
    finally:
        _OFFSET = 1
    assert counter.frame_count == 2


def local_changes_after_class_closed_over_it(x):
    k = 5

    class UsesK:
        def get(self):
            return k

    k = 6
    return x * UsesK().get()


def test_a_local_changed_after_a_class_closed_over_it_is_not_captured_wrong():
    with pytest.raises(kiln.Unsupported):
        kiln.compile(local_changes_after_class_closed_over_it, backend=CompileCounter(), fullgraph=True)(t(2))
    check_graphs(local_changes_after_class_closed_over_it, t(2))


def returns_an_instance(x):
    class Holder:
        def __init__(self, v):
            self.v = v

    return Holder(x + 1)


def test_instance_of_a_class_made_in_frame_is_rebuilt():
    x = t(2)
    h = kiln.compile(returns_an_instance, backend=CompileCounter(), fullgraph=True)(x)
    assert type(h).__name__ == "Holder"
    torch.testing.assert_close(h.v, x + 1)


# ---- grad-mode decorators, contextmanager, TorchScript hooks -------------------------------------------
@torch.no_grad()
def _doubled_without_grad(a):
    return a * 2


@torch.enable_grad()
def _tripled_with_grad(a):
    return a * 3


def nested_grad_decorators(x):
    y = _doubled_without_grad(x)
    with torch.no_grad():
        z = _tripled_with_grad(x)
    return y + 1, z, y.requires_grad, z.requires_grad


def grad_decorator_applied_in_frame(x):
    f = torch.no_grad()(lambda a: a * 2)
    g = torch.enable_grad()(lambda a: a + 1)
    return f(x), g(x), torch.is_grad_enabled()


@torch.inference_mode()
def _inference_sin(a):
    return a.sin()


@torch.inference_mode
def _inference_cos(a):
    return a.cos()


def inference_mode_blocks(x):
    with torch.inference_mode():
        y = x * 2
        with torch.inference_mode(False):
            z = x + 1
    return y + 1, z, _inference_sin(x) + _inference_cos(x), y.requires_grad, z.requires_grad


def grad_mode_classes_called_on_functions(x):
    def inner(a):
        return a.sin()

    with torch.no_grad():
        with_grad = torch.enable_grad(inner)  # decorates without a call, and changes no mode here
        assert not torch.is_grad_enabled()
    with torch.set_grad_enabled(False):
        @torch.set_grad_enabled(True)
        def also_with_grad(a):
            return a.cos()
        assert not torch.is_grad_enabled()
    with torch.no_grad():
        return with_grad(x), torch.no_grad(inner)(x), also_with_grad(x)


class _SwitchesGradItself:
    def __init__(self, mode):
        self.mode = mode

    def __enter__(self):
        self.prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(self.mode)

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.prev)


def user_context_manager_setting_grad(x):
    with _SwitchesGradItself(False):
        y = x * 2
    return y, x * 3


@contextlib.contextmanager
def _recording(log, value):
    log.append("enter")
    try:
        yield value
    finally:
        log.append("exit")


def contextmanager_block(x):
    log = []
    with _recording(log, 3) as v:
        y = x * v
    return y, log


def torchscript_hooks(x):
    a = torch.jit.annotate(typing.List[int], [])
    a.append(2)
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return x
    return torch.jit.annotate(torch.Tensor, x + a[0])


@pytest.mark.parametrize("fn", [nested_grad_decorators, grad_decorator_applied_in_frame, inference_mode_blocks,
                                grad_mode_classes_called_on_functions, user_context_manager_setting_grad,
                                contextmanager_block, torchscript_hooks])
def test_context_and_decorators_one_graph(fn):
    check_graphs(fn, t(3).requires_grad_(), graphs=1, fullgraph=True)


def classmethods_of_builtin_types(a, b):
    d = dict.fromkeys(["a", "b"], a)
    o = collections.OrderedDict.fromkeys("xy", b)
    return d["a"] + o["y"]


def test_classmethods_of_builtin_types_do_not_recompile():
    counter = CompileCounter()
    compiled = kiln.compile(classmethods_of_builtin_types, backend=counter)
    for _ in range(3):
        assert_same(classmethods_of_builtin_types, compiled, t(2), t(2))
    assert counter.frame_count == 1


class Layers:
    """A cache-like object whose truth is its Python __len__ (Hugging Face's caches)."""

    def __init__(self):
        self.items = []

    def __len__(self):
        return len(self.items)


class Flag:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on > 0

    def __len__(self):  # __bool__ wins, as in CPython
        return 0


def truth_of_objects_made_in_frame(x, on):
    layers, flag = Layers(), Flag(on)
    x = x.sin()
    if layers:  # empty: False
        x = x + 1
    layers.items.append(x)
    if layers and flag:
        x = x * 2
    if not Flag(-on):
        x = x - 3
    return x, len(layers)


@pytest.mark.parametrize("on", [1, -1])
def test_truth_of_an_object_made_in_the_frame_runs_its_python_bool_or_len(on):
    check_graphs(truth_of_objects_made_in_frame, t(3), on, graphs=1, fullgraph=True)
