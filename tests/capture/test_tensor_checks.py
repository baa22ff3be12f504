"""Tensor guards checked by the native helper (kiln/capture/tensor_checks.py): it answers exactly as
the Python line would for every kind of tensor change, and a module's tensors changed after compile
in any way the graph depended on recompile (never a stale result)."""
import itertools

import pytest
import torch
from torch import nn

import kiln
from kiln.capture import tensor_checks
from kiln.capture.guards import GuardSet
from kiln.capture.sources import LocalSource
from tests.utils import CompileCounter

pytestmark = pytest.mark.skipif(not tensor_checks._helper(wait=True), reason="the native helper does not build here")


def _pool():
    base = torch.randn(4, 6)
    return [
        torch.randn(4, 6), torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6).requires_grad_(),
        nn.Parameter(torch.randn(4, 6)), nn.Parameter(torch.randn(4, 6), requires_grad=False),
        base.t(), base[:, ::2], base[1:], torch.randn(6, 4), torch.randn(24), torch.tensor(3.0),
        torch.empty(0, 6), torch.randn(4, 6).to_sparse(), torch.zeros(4, 6, dtype=torch.int64),
        torch.randn(1, 4, 6, 2), torch.randn(1, 4, 6, 2).to(memory_format=torch.channels_last),
        torch.randn(4, 6, requires_grad=True) * 2,  # a non-leaf that requires grad
    ]


def _both_checks(captured, dynamic=()):
    """(native check, Python line) of the guard tensor_match makes for `captured`, both f(value)."""
    guards = GuardSet()
    guards.tensor_match(LocalSource(0, "x"), captured, dynamic)
    (guard,) = guards.guards
    ns = dict(guards.ctx.consts)
    python = eval(f"lambda v: {guard.check}", ns)
    if guard.native is None:
        return None, python
    inline = eval(f"lambda v: {guard.native[0]}", ns)
    spec = guard.native[1]
    return (lambda v: inline(v) and tensor_checks.check_all((v,), (spec,))), python


def _python_answer(check, value):
    try:
        return bool(check(value))
    except Exception:  # a guard that raises fails
        return False


@pytest.mark.parametrize("dynamic", [(), (0,)], ids=["static", "dynamic_dim0"])
def test_native_check_answers_as_the_python_line(dynamic):
    pool = _pool()
    native_used = 0
    for captured, now in itertools.product(pool, pool):
        if captured.layout != torch.strided or (dynamic and captured.dim() == 0):
            continue
        native, python = _both_checks(captured, dynamic)
        if native is None:
            continue
        native_used += 1
        assert native(now) == _python_answer(python, now), (captured, now)
    assert native_used > 100


def test_subclass_and_sparse_tensors_keep_python_lines():
    class Tagged(torch.Tensor):
        pass
    assert tensor_checks.spec(torch.randn(2).as_subclass(Tagged)) is None
    assert tensor_checks.spec(torch.randn(2, 2).to_sparse()) is None
    assert tensor_checks.spec(torch.randn(2)) is not None


def test_entry_guard_checks_tensors_in_one_native_call():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    compiled = kiln.compile(model, backend="eager")
    compiled(torch.randn(3, 4))
    from kiln.capture import runtime
    shapes = [[spec[5] for spec in _native_specs(e)]
              for cs in runtime._CACHES.values() for c in cs.values() for e in c.entries]
    # the input and the four parameters, in one native call; no tensor guard left as a Python line
    assert [(3, 4), (4, 4), (4,), (2, 4), (2,)] in shapes
    assert all(".stride() ==" not in e.guard_src for cs in runtime._CACHES.values() for c in cs.values()
               for e in c.entries)


def _native_specs(entry):
    ns = entry.check.__globals__
    return [spec for name, specs in ns.items() if name.startswith("TSPECS") for spec in specs]


def _mutations():
    def replace_weight(m):
        m[0].weight = nn.Parameter(torch.randn(4, 4))  # same facts: no recompile needed, new values used

    def resize_weight_data(m):
        m[0].weight.data = torch.randn(4, 4).t()  # strides changed

    def weight_dtype(m):
        m.double()

    def weight_frozen(m):
        m[0].weight.requires_grad_(False)

    def weight_set_in_place(m):  # the same Parameter objects, other strides
        with torch.no_grad():
            m[2].weight.set_(torch.randn(4, 2).t())
            m[2].bias.set_(torch.randn(4)[::2])

    def buffer_replaced(m):
        m[1].register_buffer("shift", torch.randn(1, 4))  # broadcast shape changed

    return [replace_weight, resize_weight_data, weight_dtype, weight_frozen, weight_set_in_place,
            buffer_replaced]


class _Shift(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x):
        return x + self.shift


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_module_tensor_changed_after_compile_is_never_stale(mutate):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _Shift(), nn.Linear(4, 2))
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x))
    mutate(model)
    x = x.to(next(model.parameters()).dtype)
    expected = model(x)
    got = compiled(x)
    torch.testing.assert_close(got, expected)
    assert got.requires_grad == expected.requires_grad
    if mutate.__name__ != "replace_weight":
        assert counter.frame_count == 2


def test_dynamic_input_changed_contiguity_recompiles():
    def f(x):
        return x * 2 + 1
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, dynamic=True)
    compiled(torch.randn(5, 3))
    compiled(torch.randn(7, 3))
    assert counter.frame_count == 1
    x = torch.randn(3, 7).t()
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 2
