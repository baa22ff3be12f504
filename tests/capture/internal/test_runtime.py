"""The runtime: binding, per-code caches, glue of breaks, eager fallbacks, explain, recompile logs."""
import logging
import warnings

import pytest
import torch

import kiln
from kiln.capture import runtime
from tests.utils import CompileCounter


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    yield
    kiln.reset()


def test_binder_matches_python_binding():
    def f(a, b=2, *rest, c, d=4, **kw):
        return a
    binder = runtime.make_binder(f)
    assert binder(1, c=3) == (1, 2, 3, 4, (), {})
    assert binder(1, 5, 6, 7, c=3, z=9) == (1, 5, 3, 4, (6, 7), {"z": 9})
    with pytest.raises(TypeError):
        binder()


def test_copies_of_a_function_share_one_cache_and_keep_their_closures():
    def make(k):
        def f(x):
            return x * k
        return f
    counter = CompileCounter()
    f2, f3 = kiln.compile(make(2), backend=counter), kiln.compile(make(3), backend=counter)
    x = torch.ones(2)
    assert f2(x).tolist() == [2, 2] and f3(x).tolist() == [3, 3]
    assert f2.__kiln_compiled__._kiln_cache is f3.__kiln_compiled__._kiln_cache
    assert counter.frame_count == 2  # one entry per closure value, in one cache


def test_break_inside_try_reaches_the_frames_handler():
    def f(x, d):
        y = x + 1
        try:
            z = d["missing"] * y  # d is an opaque object: the subscript breaks and raises natively
        except KeyError:
            z = y * 10
        return z
    compiled = kiln.compile(f, backend=CompileCounter())

    class D:
        def __getitem__(self, k):
            raise KeyError(k)
    x = torch.ones(2)
    assert compiled(x, D()).tolist() == [20.0, 20.0]


def test_cache_size_limit_warns_once_and_stays_correct():
    def f(x, n):
        return x + n
    compiled = kiln.compile(f, backend=CompileCounter(), dynamic=False)  # one entry per value of n
    with kiln.config.patch(cache_size_limit=2), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(5):
            assert compiled(torch.zeros(1), n).item() == n
    assert sum("cache_size_limit" in str(w.message) for w in caught) == 1


def test_recompile_log_names_the_failed_guard(caplog):
    from kiln.debug.logs import set_logs
    set_logs("recompiles")
    try:
        def f(x):
            return x * 2
        compiled = kiln.compile(f, backend="eager")
        with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
            compiled(torch.zeros(2))
            compiled(torch.zeros(3))
        assert "L['x']" in caplog.text and "Recompiling" in caplog.text
    finally:
        set_logs("")


def test_generator_function_runs_eagerly():
    def gen(x):
        yield x + 1
    compiled = kiln.compile(gen, backend=CompileCounter())
    assert list(compiled(torch.ones(1)))[0].item() == 2.0


def test_internal_error_falls_back_to_eager(monkeypatch):
    from kiln.capture import convert

    def broken(*args, **kwargs):
        raise RuntimeError("bug")
    monkeypatch.setattr(convert, "_compile_frame", broken)
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    compiled = kiln.compile(lambda x: x + 1, backend="eager")
    assert compiled(torch.zeros(1)).item() == 1.0


def test_explain_counts_and_reasons():
    def f(x):
        x = x.sin()
        print("hi")
        return x.cos()
    out = kiln.explain(f)(torch.randn(2))
    assert out.graph_count == 2 and out.graph_break_count == 1
    assert "print" in str(out.break_reasons[0]) and "test_runtime.py" in str(out.break_reasons[0])
