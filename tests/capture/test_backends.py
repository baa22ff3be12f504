"""Backends under capture: any (gm, example_inputs) -> callable works; a backend that raises is a
BackendCompilerFailed naming it and chaining the cause, or the eager result under suppress_errors."""
import logging
import warnings

import pytest
import torch

import kiln
from tests.utils import CompileCounter


def exploding_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


def f(x):
    return x.sin() + x.cos()


def test_backend_receives_graph_module_and_example_inputs():
    seen = []

    def backend(gm, example_inputs):
        seen.append((type(gm), [type(t) for t in example_inputs], [t.shape for t in example_inputs]))
        return gm.forward
    x = torch.randn(3, 2)
    torch.testing.assert_close(kiln.compile(f, backend=backend)(x), f(x))
    assert len(seen) == 1
    gm_type, input_types, shapes = seen[0]
    assert issubclass(gm_type, torch.fx.GraphModule)
    assert all(issubclass(t, torch.Tensor) for t in input_types) and torch.Size([3, 2]) in shapes


def test_backend_result_is_what_runs():
    def backend(gm, example_inputs):
        return lambda *args: (torch.full((3,), 42.0),)
    out = kiln.compile(lambda x: x + 1, backend=backend)(torch.randn(3))
    torch.testing.assert_close(out, torch.full((3,), 42.0))


def test_raising_backend_is_backend_compiler_failed():
    compiled = kiln.compile(f, backend=exploding_backend)
    with pytest.raises(kiln.BackendCompilerFailed) as info:
        compiled(torch.randn(3))
    assert "exploding_backend" in str(info.value) and "backend exploded" in str(info.value)


@pytest.mark.torch_differs("raises BackendCompilerFailed `from None`: the cause is not chained")
def test_backend_compiler_failed_chains_the_cause():
    compiled = kiln.compile(f, backend=exploding_backend)
    with pytest.raises(kiln.BackendCompilerFailed) as info:
        compiled(torch.randn(3))
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "backend exploded" in str(info.value.__cause__)


def test_raising_backend_with_suppress_errors_gives_eager_result():
    compiled = kiln.compile(f, backend=exploding_backend)
    x = torch.randn(3)
    with kiln.config.patch(suppress_errors=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(compiled(x), f(x))
        torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.kiln_only
def test_suppress_errors_warns(caplog):
    compiled = kiln.compile(f, backend=exploding_backend)
    with kiln.config.patch(suppress_errors=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(torch.randn(3))
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records
                                                    if r.levelno >= logging.WARNING]
    assert any("exploding_backend" in m and "backend exploded" in m for m in messages), messages


@pytest.mark.kiln_only
def test_named_backend_failure_names_it():
    name = "acceptance_exploding"
    if name not in kiln.list_backends(None):
        kiln.register_backend(exploding_backend, name=name)
    with pytest.raises(kiln.BackendCompilerFailed, match=name):
        kiln.compile(f, backend=name)(torch.randn(3))


def test_backend_failure_in_resume_graph(capsys):
    calls = []

    def fails_second_time(gm, example_inputs):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("second graph refused")
        return gm.forward

    def g(x):
        y = x + 1
        print("break")
        return y * 2
    with pytest.raises(kiln.BackendCompilerFailed):
        kiln.compile(g, backend=fails_second_time)(torch.randn(3))


def test_eager_backend_by_name():
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_named_compiler_backends_match_eager(backend):
    def g(x, w):
        return torch.nn.functional.gelu(x @ w).sum(-1) + x.mean()
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(kiln.compile(g, backend=backend)(x, w), g(x, w), rtol=1e-4, atol=1e-5)


def test_two_compiles_with_different_backends_both_used():
    a, b = CompileCounter(), CompileCounter()

    def g(x):
        return x * 3
    x = torch.randn(2)
    torch.testing.assert_close(kiln.compile(g, backend=a)(x), x * 3)
    torch.testing.assert_close(kiln.compile(g, backend=b)(x), x * 3)
    assert a.frame_count == 1 and b.frame_count == 1
