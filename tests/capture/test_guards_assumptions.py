"""Guards cover every fact a compiled graph assumed (issue 11): facts of tensors read in the frame,
Python attributes present or absent on tensors, classes reached through instances (their methods,
`__call__`, `__getattr__`), nn.Module attribute lookup in CPython's order, a module's own
`__call__`, the compiled module's attribute forwarding, torch._check, and which input tensors
alias. Eager is the oracle: each test runs the program eagerly and compiled, changes the fact
between calls, and compares results and the state after each call."""
import types

import pytest
import torch
from torch import nn

import kiln
from tests.utils import CompileCounter, assert_equal_state, check_calls


def compiled_counting(fn, **kwargs):
    counter = CompileCounter()
    return kiln.compile(fn, backend=counter, **kwargs), counter


def compiled_like_eager(fn, *args):
    """`fn` compiled (counting backend), called once and compared with eager; returns the compiled."""
    compiled, _ = compiled_counting(fn)
    torch.testing.assert_close(compiled(*args), fn(*args))
    return compiled


# ---- facts of tensors read in the frame ------------------------------------------------------------
def branch_on_inference(x):
    return x + 1 if x.is_inference() else x - 1


def test_inference_tensor_does_not_reuse_a_normal_tensors_graph():
    compiled, counter = compiled_counting(branch_on_inference)
    x = torch.randn(3)
    with torch.inference_mode():
        x_inf = torch.randn(3)
    for arg in (x, x_inf, x, x_inf):
        torch.testing.assert_close(compiled(arg), branch_on_inference(arg))
    assert counter.frame_count == 2


def test_inference_fact_of_a_tensor_made_in_the_frame():
    def f(x):
        y = x * 2
        return y + 1 if y.is_inference() else y - 1
    compiled, _ = compiled_counting(f)
    x = torch.randn(3)
    with torch.inference_mode():
        x_inf = torch.randn(3)
    for arg in (x, x_inf):
        torch.testing.assert_close(compiled(arg), f(arg))


def test_storage_offset_read_in_the_frame_is_guarded():
    def f(x):
        return x * x.storage_offset()
    compiled, _ = compiled_counting(f)
    # same size and stride, other offsets into their storage
    for arg in (torch.randn(4)[1:], torch.randn(5)[2:]):
        torch.testing.assert_close(compiled(arg), f(arg))


def test_conj_bit_read_in_the_frame_is_guarded():
    def f(x):
        return x * 2 if torch.is_conj(x) else x * 3
    compiled, _ = compiled_counting(f)
    z = torch.randn(3, dtype=torch.complex64)
    for arg in (z, z.conj()):
        torch.testing.assert_close(compiled(arg), f(arg))


def test_leaf_tensor_read_in_the_frame_is_guarded():
    def f(x):
        return x * 2 if x.is_leaf else x * 3
    compiled, _ = compiled_counting(f)
    w = torch.randn(3, requires_grad=True)
    for arg in (w, w * 1, torch.randn(3, requires_grad=True)):
        torch.testing.assert_close(compiled(arg), f(arg))


# ---- Python attributes on tensors --------------------------------------------------------------------
def branch_on_attribute(x):
    if hasattr(x, "test"):
        return x + 1
    return x - 1


def test_tensor_python_attribute_present_or_absent_is_guarded():
    compiled, counter = compiled_counting(branch_on_attribute)
    plain, tagged = torch.randn(3), torch.randn(3)
    tagged.test = True
    for arg in (plain, tagged, plain):
        torch.testing.assert_close(compiled(arg), branch_on_attribute(arg))
    assert counter.frame_count == 2


def test_callable_attribute_of_a_parameter_is_called_and_guarded():
    def f(p, x):
        return p.add_one(x) * p

    compiled, counter = compiled_counting(f, fullgraph=True)
    p, x = nn.Parameter(torch.randn(3)), torch.randn(3)
    p.add_one = lambda v: v + 1
    torch.testing.assert_close(compiled(p, x), f(p, x))
    p.add_one = lambda v: v + 2
    torch.testing.assert_close(compiled(p, x), f(p, x))
    assert counter.frame_count == 2


def test_attribute_set_on_an_input_tensor_is_replayed():
    def f(x):
        x.scale = 2.0
        return x * x.scale

    compiled, counter = compiled_counting(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x.clone()))
    assert x.scale == 2.0
    assert counter.frame_count == 1


def test_attribute_set_on_a_tensor_made_in_the_frame_is_replayed():
    def f(x):
        y = x + 1
        y.tag = "made here"
        return y

    compiled, _ = compiled_counting(f, fullgraph=True)
    out = compiled(torch.randn(3))
    assert out.tag == "made here"


def test_setting_a_tensor_property_still_breaks():
    def f(x):
        y = x * 2
        y.requires_grad = True
        return y

    check_calls(f, [(torch.randn(3),)])


class Slotted:
    __slots__ = ("a", "b")


def test_unset_slot_of_an_object_is_guarded_absent():
    def f(x, obj):
        return x + (obj.b if hasattr(obj, "b") else obj.a)
    compiled, counter = compiled_counting(f, fullgraph=True)
    obj, x = Slotted(), torch.zeros(2)
    obj.a = 1
    torch.testing.assert_close(compiled(x, obj), f(x, obj))
    obj.b = 5
    torch.testing.assert_close(compiled(x, obj), f(x, obj))
    assert counter.frame_count == 2


# ---- classes reached through instances ------------------------------------------------------------------
class Adder:
    def __call__(self, x):
        return x + 1

    def scale(self, x):
        return x * 2


def call_it(x, obj):
    return obj(x)


def test_replacing_call_on_the_class_recompiles(monkeypatch):
    compiled, counter = compiled_counting(call_it)
    x, obj = torch.randn(3), Adder()
    torch.testing.assert_close(compiled(x, obj), call_it(x, obj))
    monkeypatch.setattr(Adder, "__call__", lambda self, x: x - 5)
    torch.testing.assert_close(compiled(x, obj), call_it(x, obj))
    assert counter.frame_count == 2


def test_class_patched_and_restored_does_not_recompile():
    compiled, counter = compiled_counting(call_it)
    x, obj = torch.randn(3), Adder()
    torch.testing.assert_close(compiled(x, obj), call_it(x, obj))
    original = Adder.__call__
    Adder.__call__ = lambda self, x: x * 0  # as make_fx patches nn.Module while it traces
    Adder.__call__ = original
    for _ in range(2):
        torch.testing.assert_close(compiled(x, obj), call_it(x, obj))
    assert counter.frame_count == 1


class Child(Adder):
    pass


@pytest.mark.torch_differs("torch.compile keeps the class's old method (no guard on the class)")
def test_replacing_a_method_of_a_base_class_recompiles(monkeypatch):
    def f(x, obj):
        return obj.scale(x)
    compiled, _ = compiled_counting(f)
    x, obj = torch.randn(3), Child()
    torch.testing.assert_close(compiled(x, obj), f(x, obj))
    monkeypatch.setattr(Adder, "scale", lambda self, x: x * 10)
    torch.testing.assert_close(compiled(x, obj), f(x, obj))


def test_getattr_added_to_the_class_later_is_seen(monkeypatch):
    def f(x, obj):
        return x * getattr(obj, "bonus", 1)
    compiled, _ = compiled_counting(f)
    x, obj = torch.randn(3), Child()
    torch.testing.assert_close(compiled(x, obj), f(x, obj))
    monkeypatch.setattr(Child, "__getattr__", lambda self, name: 7, raising=False)
    torch.testing.assert_close(compiled(x, obj), f(x, obj))


@pytest.mark.torch_differs("torch.compile keeps the class's old method (no guard on the class)")
def test_method_of_an_object_made_in_the_frame_replaced_on_its_class(monkeypatch):
    def f(x):
        return Child().scale(x)
    compiled, _ = compiled_counting(f)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    monkeypatch.setattr(Child, "scale", lambda self, x: x - 3, raising=False)
    torch.testing.assert_close(compiled(x), f(x))


# ---- nn.Module attribute lookup in CPython's order -----------------------------------------------------------
class HasLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x)


class MethodShadowsSubmodule(HasLinear):
    def linear(self, x):  # a class attribute: found before Module.__getattr__ looks in _modules
        return x * 7


class PropertyShadowsBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self._buffers["gain"] = torch.full((3,), 2.0)  # register_buffer refuses a name the class has

    @property
    def gain(self):  # a data descriptor: found before the buffer
        return 5.0

    def forward(self, x):
        return x * self.gain


@pytest.mark.parametrize("make", [MethodShadowsSubmodule, PropertyShadowsBuffer],
                         ids=["method_over_submodule", "property_over_buffer"])
def test_module_attribute_lookup_follows_cpython(make):
    torch.manual_seed(0)
    compiled_like_eager(make(), torch.randn(3))


@pytest.mark.torch_differs("torch.compile keeps the class's old method (no guard on the class)")
def test_method_added_to_a_module_class_after_compiling_recompiles(monkeypatch):
    torch.manual_seed(0)
    mod, x = HasLinear(), torch.randn(3)
    compiled = compiled_like_eager(mod, x)
    monkeypatch.setattr(HasLinear, "linear", lambda self, x: x + 100, raising=False)
    torch.testing.assert_close(compiled(x), mod(x))


def test_method_shadowed_on_the_instance_is_seen():
    class Scaled(nn.Module):
        def factor(self):
            return 2.0

        def forward(self, x):
            return x * self.factor()
    mod = Scaled()
    compiled, _ = compiled_counting(mod)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), mod(x))
    mod.factor = lambda: 10.0
    torch.testing.assert_close(compiled(x), mod(x))


def test_lazily_set_module_attribute_absent_then_present():
    class Counts(nn.Module):
        def forward(self, x):
            self.calls = getattr(self, "calls", 0) + 1
            return x * self.calls
    eager, mod = Counts(), Counts()
    compiled, _ = compiled_counting(mod)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), eager(x))
    assert mod.calls == eager.calls == 3


# ---- a module's own __call__ --------------------------------------------------------------------------------
class FiveTimes(HasLinear):
    def __call__(self, x):
        return 5 * self.forward(x)


def test_module_overriding_call_inside_a_compiled_function():
    torch.manual_seed(0)
    mod = FiveTimes()

    def f(x, m):
        return m(x) + 1
    compiled, counter = compiled_counting(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, mod), f(x, mod))
    assert counter.frame_count == 1


def test_compiled_module_overriding_call():
    torch.manual_seed(0)
    mod = FiveTimes()
    compiled, _ = compiled_counting(mod)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), mod(x))


def test_compiled_module_overriding_call_at_a_graph_break():
    torch.manual_seed(0)
    mod = FiveTimes()

    @kiln.disable
    def opaque(t):
        return t

    def f(x, m):
        y = opaque(x)
        return m(y)
    compiled, _ = compiled_counting(f)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, mod), f(x, mod))


# ---- the compiled module forwards attributes ---------------------------------------------------------------
class Scales(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        return x * self.scale


def test_setting_an_attribute_on_the_compiled_module_sets_it_on_the_original():
    mod = Scales()
    compiled = kiln.compile(mod, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2.0)
    compiled.scale = 3.0
    assert mod.scale == 3.0
    torch.testing.assert_close(compiled(x), x * 3.0)
    compiled.extra = "new"
    assert mod.extra == "new"
    del compiled.extra
    assert not hasattr(mod, "extra")


def test_compiled_module_dir_and_training_are_the_originals():
    mod = nn.Linear(2, 2)
    compiled = kiln.compile(mod, backend="eager")
    assert {"weight", "bias", "in_features"} <= set(dir(compiled))
    compiled.eval()
    assert mod.training is False and compiled.training is False
    mod.train()
    assert compiled.training is True


# ---- torch._check --------------------------------------------------------------------------------------------
def checks_first_dim(x):
    torch._check(x.shape[0] == 3, lambda: f"expected 3 rows, got {x.shape[0]}")
    return x + 1


def checks_index(x):
    torch._check_index(x.shape[0] < 3)
    return x * 2


@pytest.mark.parametrize("fn", [checks_first_dim, pytest.param(checks_index, marks=pytest.mark.torch_differs(
    "torch.compile raises its own TorchRuntimeError, not eager's IndexError"))])
def test_torch_check_raises_what_eager_raises(fn):
    check_calls(fn, [(torch.randn(2),), (torch.randn(4),), (torch.randn(3),)])


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.torch_differs('torch.compile breaks on a message closure over a tensor')
def test_passing_torch_check_with_a_message_is_captured(dynamic):
    compiled, counter = compiled_counting(checks_first_dim, fullgraph=True, dynamic=dynamic)
    x = torch.randn(3, 2)
    torch.testing.assert_close(compiled(x), checks_first_dim(x))
    assert counter.frame_count == 1
    with pytest.raises(RuntimeError, match="expected 3 rows, got 4"):
        kiln.compile(checks_first_dim, backend="eager", dynamic=dynamic)(torch.randn(4, 2))


# ---- generated code, internal errors --------------------------------------------------------------------------
def test_int_accumulator_that_becomes_a_tensor_stays_in_one_graph():
    def f(ts):
        total, product = 0, 1.0
        for t in ts:
            total += t
            product *= t
        return total, product
    compiled, counter = compiled_counting(f, fullgraph=True)
    ts = [torch.randn(3) for _ in range(3)]
    assert_equal_state(compiled(ts), f(ts))
    assert counter.frame_count == 1


@pytest.mark.kiln_only
def test_internal_error_raises_under_fullgraph_and_runs_eagerly_otherwise(monkeypatch):
    from kiln.capture import glue

    def broken(*args, **kwargs):
        raise SyntaxError("generated code is broken")
    monkeypatch.setattr(glue.Glue, "function", broken)

    def f(x):
        return x.sin() + 1
    x = torch.randn(3)
    with pytest.raises(kiln.InternalError, match="generated code is broken"):
        kiln.compile(f, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))


# ---- aliasing between input tensors -----------------------------------------------------------------------------
def doubles_then_reads(x, y):
    x.mul_(2)
    return y + 1


def distinct():
    return torch.ones(4), torch.ones(4)


def same_tensor():
    t = torch.ones(4)
    return t, t


def overlapping_views():
    t = torch.arange(6.0)
    return t[0:4], t[1:5]


def disjoint_views():
    t = torch.arange(8.0)
    return t[0:4], t[4:8]


BACKENDS = ["eager", "aot_eager", "inductor"]


def _run_like_eager(compiled, fn, make_args):
    eager_args, compiled_args = make_args(), make_args()
    expected, actual = fn(*eager_args), compiled(*compiled_args)
    torch.testing.assert_close(actual, expected)
    for e, c in zip(eager_args, compiled_args):
        torch.testing.assert_close(c, e)


ORDERS = {"distinct-same": (distinct, same_tensor), "same-distinct": (same_tensor, distinct),
          "distinct-overlap": (distinct, overlapping_views), "overlap-distinct": (overlapping_views, distinct),
          "disjoint-overlap": (disjoint_views, overlapping_views), "overlap-same": (overlapping_views, same_tensor)}
TORCH_MISSES_VIEWS = pytest.mark.torch_differs("torch.compile's aot_eager reuses a graph built for other aliasing")


def _aliasing_cases():
    for backend in BACKENDS:
        for name, order in ORDERS.items():
            marks = TORCH_MISSES_VIEWS if backend == "aot_eager" and "overlap" in name and name != "overlap-same" else ()
            yield pytest.param(backend, order, id=f"{name}-{backend}", marks=marks)


@pytest.mark.parametrize("backend, order", _aliasing_cases())
def test_aliasing_pattern_of_mutated_inputs(backend, order):
    compiled = kiln.compile(doubles_then_reads, backend=backend)
    for make_args in order + order:
        _run_like_eager(compiled, doubles_then_reads, make_args)


@pytest.mark.parametrize("backend, alias", [
    pytest.param(backend, alias, id=f"{alias}-{backend}",
                 marks=TORCH_MISSES_VIEWS if (alias, backend) in {("view_of_parameter", "aot_eager"), ("buffer_view",
                                                                   "aot_eager"), ("buffer_view", "inductor")} else ())
    for backend in BACKENDS for alias in ("parameter", "view_of_parameter", "buffer_view")])
def test_module_tensor_also_passed_as_input(backend, alias):
    def f(x, lin):
        x.mul_(2)
        return lin(torch.ones(1, 2)) + lin.shift.sum()

    def make():
        torch.manual_seed(0)
        lin = nn.Linear(2, 2).requires_grad_(False)
        lin.register_buffer("shift", torch.ones(2, 2))
        return lin

    def aliased(lin):
        return {"parameter": lin.weight, "view_of_parameter": lin.weight[0:2],
                "buffer_view": lin.shift[0:2]}[alias]
    eager_lin, compiled_lin = make(), make()
    compiled = kiln.compile(f, backend=backend)
    for use_module_tensor in (False, True, False, True):
        e_x = aliased(eager_lin) if use_module_tensor else torch.ones(2, 2)
        c_x = aliased(compiled_lin) if use_module_tensor else torch.ones(2, 2)
        torch.testing.assert_close(compiled(c_x, compiled_lin), f(e_x, eager_lin))
        torch.testing.assert_close(compiled_lin.weight, eager_lin.weight)
        torch.testing.assert_close(compiled_lin.shift, eager_lin.shift)


def test_identity_of_input_tensors_read_in_the_frame():
    def f(x, y):
        return x + 1 if x is y else x - 1
    compiled, _ = compiled_counting(f)
    a, b = torch.randn(3), torch.randn(3)
    for args in ((a, b), (a, a), (a, b)):
        torch.testing.assert_close(compiled(*args), f(*args))


@pytest.mark.kiln_only
def test_frames_that_neither_write_inputs_nor_compare_them_have_no_aliasing_guard():
    def reads_only(x, y):
        return x * y

    def writes(x, y):
        x.add_(1)
        return x * y
    for fn, guarded in ((reads_only, False), (writes, True)):
        compiled = kiln.compile(fn, backend="eager")
        compiled(torch.randn(3), torch.randn(3))
        (entry,) = compiled.__kiln_compiled__._kiln_cache.entries
        assert ("alias as" in " ".join(map(str, entry.guards))) is guarded


def test_forward_replaced_on_the_instance_is_called_and_guarded():
    class Doubles(nn.Module):
        def forward(self, x):
            return x * 2

    def halves(self, x):
        return x / 2
    mod = Doubles()

    def f(x):
        return mod(x) + 1
    compiled, _ = compiled_counting(f, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    mod.forward = types.MethodType(halves, mod)
    torch.testing.assert_close(compiled(x), f(x))
    del mod.forward
    torch.testing.assert_close(compiled(x), f(x))


def test_lazy_module_is_initialized_from_the_first_call_and_captured():
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    eager, mod = make(), make()
    compiled, counter = compiled_counting(mod, fullgraph=True)
    x = torch.randn(3, 5)
    torch.manual_seed(1)
    expected = eager(x)
    torch.manual_seed(1)
    torch.testing.assert_close(compiled(x), expected)
    torch.testing.assert_close(compiled(x), eager(x))
    assert type(mod[0]) is nn.Linear and counter.frame_count == 1


def test_python_function_passed_to_a_torch_function_is_not_put_in_the_graph():
    def f(x, fn):
        return torch.fx.node.map_aggregate([x, x + 1], fn)
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    assert_equal_state(compiled(x, torch.sin), f(x, torch.sin))
    assert counter.frame_count == 1  # a graph break at the call, not the whole frame run eagerly
