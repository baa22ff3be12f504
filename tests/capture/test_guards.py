"""Guards and caches: whatever the graph depended on is checked on every call, so changed globals,
cells, module attributes, parameters, hooks, dtypes, shapes never give a stale result; changes
recompile (counted); copies of one code object share a cache; the cache size limit holds."""
import logging
import sys
import types
import warnings

import pytest
import torch
from torch import nn

import kiln
from tests.utils import CompileCounter

SCALE = 2.0
FLAG = True


def helper(t):
    return t + 1


def uses_global_scale(x):
    return x * SCALE


def uses_global_flag(x):
    return x.sin() if FLAG else x.cos()


def uses_global_function(x):
    return helper(x) * 2


def compiled_counting(fn, **kwargs):
    counter = CompileCounter()
    return kiln.compile(fn, backend=counter, **kwargs), counter


def check(compiled, fn, *args):
    torch.testing.assert_close(compiled(*args), fn(*args))


def test_same_inputs_hit_the_cache():
    compiled, counter = compiled_counting(uses_global_scale)
    for _ in range(5):
        check(compiled, uses_global_scale, torch.randn(3))
    assert counter.frame_count == 1


@pytest.mark.parametrize("fn, name, new_value", [
    (uses_global_scale, "SCALE", 5.0),
    (uses_global_flag, "FLAG", False),
    (uses_global_function, "helper", lambda t: t * 100),
], ids=["float", "bool", "function"])
def test_changed_global_recompiles(fn, name, new_value, monkeypatch):
    compiled, counter = compiled_counting(fn)
    x = torch.randn(3)
    check(compiled, fn, x)
    monkeypatch.setattr(sys.modules[__name__], name, new_value)
    check(compiled, fn, x)
    assert counter.frame_count == 2


def test_changed_global_tensor_not_stale(monkeypatch):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "WEIGHTS", torch.ones(3), raising=False)

    def f(x):
        return x * module.WEIGHTS
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    check(compiled, f, x)
    monkeypatch.setattr(module, "WEIGHTS", torch.full((3,), 7.0))
    check(compiled, f, x)


def make_cell_user():
    k = 2.0

    def f(x):
        return x * k

    def set_k(v):
        nonlocal k
        k = v
    return f, set_k


def test_changed_closure_cell_recompiles():
    f, set_k = make_cell_user()
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    check(compiled, f, x)
    set_k(-3.0)
    check(compiled, f, x)
    assert counter.frame_count == 2


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alpha = 0.5
        self.use_relu = True

    def forward(self, x):
        y = self.lin(x) * self.alpha
        if self.training:
            y = y * 2
        return y.relu() if self.use_relu else y


@pytest.mark.parametrize("attr, value", [("use_relu", False), ("training", False)])
def test_changed_module_attribute_recompiles(attr, value):
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    setattr(model, attr, value)
    check(compiled, model, x)
    assert counter.frame_count == 2


def test_changed_module_float_attribute_not_stale():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    for alpha in (0.5, 2.0, -1.0):
        model.alpha = alpha
        check(compiled, model, x)
    assert counter.frame_count >= 2


def test_replaced_submodule_not_stale():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    model[1] = nn.Tanh()
    check(compiled, model, x)
    assert counter.frame_count == 2


def test_replaced_parameter_object_not_stale():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    model.lin.weight = nn.Parameter(torch.randn(4, 4) * 10)
    check(compiled, model, x)
    model.lin.bias = None
    check(compiled, model, x)
    assert counter.frame_count <= 3


def test_parameter_updated_in_place_not_stale():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    with torch.no_grad():
        model.lin.weight.add_(1.0)
    check(compiled, model, x)
    assert counter.frame_count == 1


def test_added_and_removed_forward_hook():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    handle = model.register_forward_hook(lambda m, args, out: out * 0 + 42)
    check(compiled, model, x)
    assert counter.frame_count == 2
    handle.remove()
    check(compiled, model, x)
    assert counter.frame_count in (2, 3)


@pytest.mark.torch_differs("a hook added to a submodule after compiling is not guarded: stale result")
def test_added_hook_on_submodule():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    model.lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    check(compiled, model, x)
    assert counter.frame_count == 2


@pytest.mark.parametrize("second", [
    torch.randn(3, dtype=torch.float64),
    torch.randn(3, requires_grad=True),
    torch.randn(3, 2)[:, 0],
    torch.randn(7)[1::2][:3],
], ids=["dtype", "requires_grad", "strided_view", "offset_view"])
def test_tensor_property_change(second):
    def f(x):
        return (x * 2).sum(-1) + x.dtype.is_floating_point
    compiled, counter = compiled_counting(f)
    check(compiled, f, torch.randn(3))
    check(compiled, f, second)
    check(compiled, f, torch.randn(3))
    assert counter.frame_count <= 2


@pytest.mark.parametrize("second", [torch.randn(3, dtype=torch.float64), torch.randn(3, requires_grad=True)],
                         ids=["dtype", "requires_grad"])
def test_dtype_and_requires_grad_recompile(second):
    def f(x):
        return x * 2
    compiled, counter = compiled_counting(f)
    check(compiled, f, torch.randn(3))
    check(compiled, f, second)
    assert counter.frame_count == 2


def test_grad_mode_change_recompiles():
    def f(x, w):
        return (x @ w).relu()
    compiled, counter = compiled_counting(f)
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    assert compiled(x, w).requires_grad
    with torch.no_grad():
        out = compiled(x, w)
    assert not out.requires_grad
    torch.testing.assert_close(out, f(x, w).detach())
    assert counter.frame_count == 2


def test_default_dtype_change_not_stale():
    def f(x):
        return torch.ones(3) + x.shape[0]
    compiled, counter = compiled_counting(f)
    x = torch.randn(2)
    check(compiled, f, x)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert compiled(x).dtype == torch.float64
        check(compiled, f, x)
    finally:
        torch.set_default_dtype(previous)


def test_rank_change_recompiles():
    def f(x):
        return x.sum(-1)
    compiled, counter = compiled_counting(f)
    for shape in [(3,), (3, 2), (3, 2, 2)]:
        check(compiled, f, torch.randn(*shape))
    assert counter.frame_count == 3


def test_shape_change_dynamic_none_recompiles_once():
    def f(x):
        return x * 2 + x.shape[0] * 0
    compiled, counter = compiled_counting(f)
    for n in (3, 4, 5, 6):
        check(compiled, f, torch.randn(n))
    assert counter.frame_count == 2


def test_shape_change_dynamic_false_recompiles_each_time():
    def f(x):
        return x.cos()
    compiled, counter = compiled_counting(f, dynamic=False)
    for n in (3, 4, 5):
        check(compiled, f, torch.randn(n))
    assert counter.frame_count == 3


def test_dynamic_true_one_graph_for_all_sizes():
    def f(x):
        return x.reshape(-1, 2).sum(0) * 2
    compiled, counter = compiled_counting(f, dynamic=True)
    for n in (2, 4, 8, 10):
        check(compiled, f, torch.randn(n))
    assert counter.frame_count == 1


def test_python_int_argument_change_not_stale():
    def f(x, n):
        return x * n + n
    compiled, counter = compiled_counting(f)
    for n in (2, 3, 4, 5):
        check(compiled, f, torch.randn(3), n)
    assert 2 <= counter.frame_count <= 4


def test_container_argument_change_not_stale():
    def f(xs):
        return sum(t * i for i, t in enumerate(xs))
    compiled, counter = compiled_counting(f)
    check(compiled, f, [torch.randn(2)] * 2)
    check(compiled, f, [torch.randn(2)] * 3)
    assert counter.frame_count == 2


class Holder:
    def __init__(self, scale):
        self.scale = scale


def test_object_attribute_change_not_stale():
    def f(x, h):
        return x * h.scale
    compiled, counter = compiled_counting(f)
    h = Holder(2)
    check(compiled, f, torch.randn(3), h)
    h.scale = 9
    check(compiled, f, torch.randn(3), h)
    assert counter.frame_count == 2


def test_argument_type_change_recompiles():
    def f(x, y):
        return x + y
    compiled, counter = compiled_counting(f)
    check(compiled, f, torch.randn(3), torch.randn(3))
    check(compiled, f, torch.randn(3), 2.5)
    assert counter.frame_count == 2


def plain(x):
    return x.sin() * 3


def test_copies_of_one_code_share_a_cache():
    counter = CompileCounter()
    copies = [types.FunctionType(plain.__code__, plain.__globals__, f"copy{i}") for i in range(3)]
    x = torch.randn(4)
    for fn in copies:
        torch.testing.assert_close(kiln.compile(fn, backend=counter)(x), plain(x))
    assert counter.frame_count == 1


def test_functions_defined_in_a_loop_share_a_cache():
    counter = CompileCounter()
    fns = []
    for _ in range(3):
        def f(x):
            return x.cos() + 1
        fns.append(kiln.compile(f, backend=counter))
    x = torch.randn(4)
    for fn in fns:
        torch.testing.assert_close(fn(x), x.cos() + 1)
    assert counter.frame_count == 1


def test_closures_from_one_code_with_different_cells_not_stale():
    counter = CompileCounter()

    def make(k):
        def f(x):
            return x * k
        return f
    x = torch.randn(3)
    for k in (1.0, 2.0, 3.0):
        torch.testing.assert_close(kiln.compile(make(k), backend=counter)(x), x * k)


def test_reset_forces_recompile():
    compiled, counter = compiled_counting(plain)
    x = torch.randn(3)
    check(compiled, plain, x)
    kiln.reset()
    check(compiled, plain, x)
    assert counter.frame_count == 2


def cache_limited(x):
    return x * 2 + 1


def test_cache_size_limit_stops_compiling_results_stay_correct():
    compiled, counter = compiled_counting(cache_limited, dynamic=False)
    with kiln.config.patch(cache_size_limit=2), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in range(2, 9):
            check(compiled, cache_limited, torch.randn(n))
    assert counter.frame_count == 2


@pytest.mark.kiln_only
def test_cache_size_limit_warns_exactly_once(caplog):
    compiled, counter = compiled_counting(cache_limited, dynamic=False)
    with kiln.config.patch(cache_size_limit=2), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(2, 9):
            check(compiled, cache_limited, torch.randn(n))
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(caught) + len(logged) == 1, [str(w.message) for w in caught] + [r.getMessage() for r in logged]
    message = str(caught[0].message) if caught else logged[0].getMessage()
    assert "cache_size_limit" in message and "cache_limited" in message


def test_cache_size_limit_default_is_64():
    if hasattr(kiln.config, "cache_size_limit"):
        assert kiln.config.cache_size_limit == 64


def test_different_module_argument_uses_its_own_weights():
    def f(m, x):
        return m(x)
    compiled, counter = compiled_counting(f)
    m1, m2 = nn.Linear(4, 4), nn.Linear(4, 4)
    x = torch.randn(2, 4)
    check(compiled, f, m1, x)
    check(compiled, f, m2, x)


def test_module_dtype_change_not_stale():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    model.double()
    out = compiled(x.double())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, model(x.double()))


def test_module_requires_grad_change_not_stale():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    assert compiled(x).requires_grad
    model.requires_grad_(False)
    assert not compiled(x).requires_grad


def test_dict_argument_keys_change_not_stale():
    def f(d):
        return sum(v * len(k) for k, v in d.items())
    compiled, counter = compiled_counting(f)
    check(compiled, f, {"a": torch.ones(2)})
    check(compiled, f, {"bb": torch.ones(2)})
    check(compiled, f, {"a": torch.ones(2), "ccc": torch.ones(2)})
    assert counter.frame_count == 3


def test_optional_argument_tensor_then_none():
    def f(x, bias=None):
        return x * 2 if bias is None else x * 2 + bias
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    check(compiled, f, x, torch.ones(3))
    check(compiled, f, x)
    check(compiled, f, x, None)
    assert counter.frame_count == 2


def test_global_module_replaced_by_other_class(monkeypatch):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "ACT", nn.ReLU(), raising=False)

    def f(x):
        return module.ACT(x)
    compiled, counter = compiled_counting(f)
    x = torch.randn(5)
    check(compiled, f, x)
    monkeypatch.setattr(module, "ACT", nn.Sigmoid())
    check(compiled, f, x)
    assert counter.frame_count == 2


def test_closure_cell_tensor_replaced_with_other_shape():
    w = torch.ones(3)

    def f(x):
        return x * w

    compiled, counter = compiled_counting(f)
    torch.testing.assert_close(compiled(torch.ones(3)), torch.ones(3))
    w = torch.full((2, 3), 2.0)  # noqa: F841  (rebinds the cell f reads)
    torch.testing.assert_close(compiled(torch.ones(3)), torch.full((2, 3), 2.0))


def test_global_forward_hook_honoured():
    model = nn.Linear(4, 4)
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    handle = nn.modules.module.register_module_forward_hook(lambda m, args, out: out * 0)
    try:
        torch.testing.assert_close(compiled(x), torch.zeros(2, 4))
    finally:
        handle.remove()
    check(compiled, model, x)


def test_hook_with_kwargs_honoured():
    model = nn.Linear(4, 4)
    model.register_forward_pre_hook(lambda m, args, kwargs: ((args[0] * 3,), kwargs), with_kwargs=True)
    model.register_forward_hook(lambda m, args, kwargs, out: out - 1, with_kwargs=True)
    compiled, counter = compiled_counting(model)
    check(compiled, model, torch.randn(2, 4))
    assert counter.frame_count == 1


def test_instance_forward_replaced_between_calls():
    model = Scaled()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    model.forward = lambda t: t * 100
    torch.testing.assert_close(compiled(x), x * 100)


class ScaleHook:
    def __init__(self, scale):
        self.scale = scale

    def __call__(self, module, args, out):
        return out * self.scale


def test_stateful_hook_object_change_not_stale():
    model = nn.Linear(4, 4)
    hook = ScaleHook(2.0)
    model.register_forward_hook(hook)
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    hook.scale = -5.0
    check(compiled, model, x)


def test_function_code_replaced_after_compile_not_stale():
    def inner(x):
        return x + 1

    def other(x):
        return x * 3

    def f(x):  # reads the code object itself (guarded equal to the captured one)
        return inner(x) if inner.__code__.co_name == "inner" else inner(x) * 10
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    check(compiled, f, x)
    check(compiled, f, x)
    assert counter.frame_count == 1
    inner.__code__ = other.__code__
    check(compiled, f, x)
    assert counter.frame_count == 2


def test_buffer_replaced_not_stale():
    class WithOffset(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.zeros(4))

        def forward(self, x):
            return x + self.offset
    model = WithOffset()
    compiled, counter = compiled_counting(model)
    x = torch.randn(2, 4)
    check(compiled, model, x)
    model.register_buffer("offset", torch.full((4,), 3.0))
    check(compiled, model, x)
    model.offset = torch.full((2, 4), -1.0)
    check(compiled, model, x)


GLOBAL_LIST = [1.0, 2.0]
GLOBAL_DICT = {"scale": 2.0}


class Config:
    factor = 2.0


def reads_global_containers(x):
    return x * GLOBAL_LIST[1] + GLOBAL_DICT["scale"]


def reads_class_attribute(x):
    return x * Config.factor


@pytest.mark.parametrize("mutate", [
    lambda: GLOBAL_LIST.__setitem__(1, 7.0),
    lambda: GLOBAL_LIST.append(3.0) or GLOBAL_LIST.pop(0),
    lambda: GLOBAL_DICT.__setitem__("scale", -4.0),
], ids=["list_item", "list_shifted", "dict_value"])
def test_mutated_global_container_not_stale(mutate, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "GLOBAL_LIST", list(GLOBAL_LIST))
    monkeypatch.setattr(sys.modules[__name__], "GLOBAL_DICT", dict(GLOBAL_DICT))
    compiled, counter = compiled_counting(reads_global_containers)
    x = torch.randn(3)
    check(compiled, reads_global_containers, x)
    mutate()
    check(compiled, reads_global_containers, x)


def test_class_attribute_change_not_stale(monkeypatch):
    compiled, counter = compiled_counting(reads_class_attribute)
    x = torch.randn(3)
    check(compiled, reads_class_attribute, x)
    monkeypatch.setattr(Config, "factor", 9.0)
    check(compiled, reads_class_attribute, x)


def test_defaults_replaced_not_stale():
    def f(x, k=2.0):
        return x * k
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    check(compiled, f, x)
    f.__defaults__ = (5.0,)
    check(compiled, f, x)


def test_closure_list_mutated_not_stale():
    scales = [1.0]

    def f(x):
        return x * scales[-1]
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    check(compiled, f, x)
    scales.append(6.0)
    check(compiled, f, x)


def test_nested_object_state_change_not_stale():
    outer = Holder(Holder({"k": 2.0}))

    def f(x, h):
        return x * h.scale.scale["k"]
    compiled, counter = compiled_counting(f)
    x = torch.randn(3)
    check(compiled, f, x, outer)
    outer.scale.scale["k"] = 11.0
    check(compiled, f, x, outer)


def test_cache_limit_reached_by_global_changes_never_stale(monkeypatch):
    compiled, counter = compiled_counting(uses_global_scale)
    x = torch.randn(3)
    with kiln.config.patch(cache_size_limit=2), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for scale in (1.0, 2.0, 3.0, 4.0, 1.0, 5.0):
            monkeypatch.setattr(sys.modules[__name__], "SCALE", scale)
            check(compiled, uses_global_scale, x)
    assert counter.frame_count == 2


def test_long_unrolled_loop_one_graph():
    def f(x):
        for i in range(100):
            x = x + i
        return x
    compiled, counter = compiled_counting(f)
    check(compiled, f, torch.randn(3))
    assert counter.frame_count == 1 and counter.op_count == 100
