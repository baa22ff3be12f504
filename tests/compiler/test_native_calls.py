"""The wrapper calls its C++ entries through native callers (compiler/native_calls): tensors handed
over whole (their data pointers read from the TensorImpl), ints and None as they are; a tensor
subclass gets its own data_ptr(); a graph loaded from the graph cache calls natively too. Eager is
the oracle."""
import ctypes
import re

import pytest
import torch
import torch.nn.functional as F

from kiln.compiler import build, graph_cache, native_calls
from tests.compiler.test_compile_fx import check

pytestmark = pytest.mark.skipif(native_calls.caller(ctypes.CDLL(None).labs, 1, wait=True) is None,
                                reason="the native helper does not build here")

_ENTRY = r"""
#include <cstdint>
extern "C" void add_one(float* out, const float* x, int64_t n, const void* ws, int64_t* err) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + 1;
  if (ws != nullptr) err[0] = n;
}
"""


def add_one_entry():
    fn = getattr(build.load_library(_ENTRY, name_hint="native_calls_test"), "add_one")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    return fn


class Tagged(torch.Tensor):
    pass


def test_a_caller_reads_tensors_ints_and_none_as_ctypes_did():
    fn = add_one_entry()
    call = native_calls.caller(fn, 5)
    assert native_calls.entry_of(call) is fn and native_calls.entry_of(fn) is None
    err = (ctypes.c_int64 * 3)()
    x = torch.arange(8.0)
    for out in (torch.zeros(8), torch.nn.Parameter(torch.zeros(8)), torch.zeros(8).as_subclass(Tagged),
                torch.zeros(10)[2:]):  # a plain tensor, a parameter, a subclass, a view at an offset
        call(out, x, 8, None, ctypes.addressof(err))
        torch.testing.assert_close(out.data.as_subclass(torch.Tensor), x + 1)
        assert err[0] == 0
    call(torch.zeros(3), x[5:], 3, 1, ctypes.addressof(err))  # a non-NULL workspace: the entry writes err
    assert err[0] == 3
    with pytest.raises(TypeError):
        call(torch.zeros(3), x, 3)


def projections(x, w, table, i):
    y = F.gelu(x) @ w  # kernels around an extern
    return F.embedding(i, table).sum(0) + y.sum(0)


def args():
    torch.manual_seed(0)
    return torch.randn(6, 8), torch.randn(8, 8), torch.randn(10, 8), torch.tensor([1, 4, 2])


def entry_lines(wrapper):
    return [line for line in wrapper.splitlines() if re.match(r"\s*entry\d+\(", line)]


def test_compiled_graph_calls_entries_with_its_tensors():
    c = check(projections, *args())
    lines = entry_lines(c.kiln_wrapper)
    assert lines and not any("data_ptr()" in line for line in lines), c.kiln_wrapper
    x, w, table, i = args()
    with pytest.raises(IndexError):  # the index check still raises through the native call
        c(x, w, table, torch.tensor([1, 12, 2]))


def test_graph_loaded_from_the_graph_cache_calls_natively(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(graph_cache, "stats", graph_cache.GraphCacheStats())
    check(projections, *args())
    loaded = check(projections, *args())
    assert graph_cache.stats.hits == 1
    graph = next(c.cell_contents for c in loaded.__closure__ if getattr(c.cell_contents, "__name__", "") == "kiln_graph")
    natives = [v for k, v in graph.__globals__.items() if k.startswith("entry")]
    assert natives and all(native_calls.entry_of(v) is not None for v in natives)
    lines = entry_lines(loaded.kiln_wrapper)
    assert lines and not any("data_ptr()" in line for line in lines)


def test_an_entry_of_over_a_thousand_buffers_is_called():
    """A sum of 1100 tensors fuses into one entry of 1101 pointers, as does the backward of an
    unbind of 1031 rows: ctypes calls at most 1024 arguments (BackendCompilerFailed), so such an
    entry takes its arguments as one array (found by tests/compiler/test_fuzz_training.py)."""
    import kiln

    def total(xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    xs = [torch.randn(4) for _ in range(1100)]
    torch.testing.assert_close(kiln.compile(total)(xs), total(xs))

    def row(a):
        return a.softmax(-1).unbind(1)[794]

    grads = []
    for fn in (row, kiln.compile(row)):
        a = torch.linspace(-1, 1, 9 * 1031).reshape(9, 1031).requires_grad_()
        fn(a).sum().backward()
        grads.append(a.grad)
    torch.testing.assert_close(grads[1], grads[0])
