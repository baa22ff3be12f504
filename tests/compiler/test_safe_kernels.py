"""Kernels never read or write outside their tensors, and symbolic sizes never stand for more than
the guards proved.

- Slice bounds over a symbolic dim are clamped as Python clamps them (`x[-512:]` of 100 rows is all
  100 rows; before, the kernel started at row -412: garbage, NaN, then SIGSEGV, as in HF XLNet).
- A symbolic size that a guard pinned to 1 broadcasts (`x + y[..., 1::2]`, where the slice has
  size s//2 and the trace guarded s//2 == 1).
- An index read from a tensor (indexing, gather, index_select, embedding) is checked when the
  kernel runs: out of range, the call raises as eager does, instead of reading other memory.
- Under `debug_bounds_checks` (KILN_BOUNDS_CHECK=1), every load and store is checked: a kernel
  that would reach outside its buffer raises an error naming the kernel and the buffer.
Eager is the oracle throughout."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.compiler import compile_fx, lowerings
from kiln.compiler.codegen.cpp_memory import KernelBoundsError
from tests.utils import assert_equal_state


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_calls(fn, calls, dynamic=True, **options):
    """fn compiled once (dynamic=True, or None: static then automatic dynamic) and called with each
    argument tuple of `calls` in order, against eager (outputs and inputs after the call)."""
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic, options={"debug": True, **options})
    for args in calls:
        eager_args = [a.clone() for a in args]
        kiln_args = [a.clone() for a in args]
        assert_equal_state(compiled(*kiln_args), fn(*eager_args), rtol=1e-6, atol=1e-6)  # sums: any order
        assert_equal_state(kiln_args, eager_args, rtol=0, atol=0)


SLICES = {
    "tail_512": lambda x: x[-512:] * 2,                 # XLNet's mems[-mem_len:]
    "tail_5": lambda x: x[-5:] + 1,
    "from_3": lambda x: x[3:] * 2,
    "from_40": lambda x: x[40:] * 2,                     # past the end on short inputs: empty
    "middle": lambda x: x[-6:-2] - 1,
    "to_100": lambda x: x[1:100] * 3,
    "stepped_tail": lambda x: x[-7::2] * 2,
    "last_dim_tail": lambda x: x[:, -3:].sum(1),
    "narrow_size": lambda x: x.narrow(0, x.size(0) - 2, 2) * 2,
    "select_last": lambda x: x[x.size(0) - 1] + x[-1],
}


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("name", sorted(SLICES))
def test_slice_bounds_over_a_symbolic_dim_clamp_as_python(name, dynamic):
    fn = SLICES[name]
    check_calls(fn, [(randn(n, 4, seed=n),) for n in (9, 3, 600, 7, 2, 513)], dynamic=dynamic)


def test_xlnet_memory_tail_on_a_shorter_sequence():
    # XLNet's cache_mem: cat the new hidden states to the memory, keep the last mem_len rows
    def cache_mem(curr, prev):
        return torch.cat([prev, curr], dim=0)[-512:].detach()
    check_calls(cache_mem, [(randn(n, 2, 8, seed=n), randn(m, 2, 8, seed=m + 1))
                            for n, m in ((7, 5), (13, 9), (300, 400), (4, 3))])


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
def test_strided_slice_pinned_to_size_one_broadcasts(dynamic):
    # y[..., 1::2] has size s//2; the trace guarded s//2 == 1 to broadcast it against x
    def fn(x, y):
        return x + y[..., 1::2]
    check_calls(fn, [(randn(7, 3, 2), randn(7, 3, 2, seed=1)), (randn(6, 2, 3), randn(6, 2, 3, seed=2)),
                     (randn(5, 4, 7), randn(5, 4, 3, seed=3))], dynamic=dynamic)


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
def test_expand_of_a_size_pinned_to_one(dynamic):
    def fn(x, y):
        return y[:, 1::3].expand(x.shape) * x
    check_calls(fn, [(randn(4, 5), randn(4, 3, seed=1)), (randn(6, 7), randn(6, 2, seed=2))], dynamic=dynamic)


W = randn(10, 4)
INDEXING = {
    "index": (lambda i: W[i] + 1, IndexError),
    "index_negative_ok": (lambda i: W[i - 10] + 1, None),
    "gather": (lambda i: torch.gather(W, 0, i.view(-1, 1).expand(-1, 4)) + 1, RuntimeError),
    "index_select": (lambda i: torch.index_select(W, 0, i) + 1, IndexError),
    "embedding": (lambda i: F.embedding(i, W) + 1, IndexError),
    "embedding_2d": (lambda i: F.embedding(i.view(1, -1), W) + 1, IndexError),  # was W[i]: took -1
}


@pytest.mark.parametrize("bad", [10, 1 << 40, -11, -1], ids=["just_past", "far_past", "below", "negative"])
@pytest.mark.parametrize("name", sorted(INDEXING))
def test_an_index_read_from_a_tensor_is_checked_when_the_kernel_runs(name, bad):
    fn, error = INDEXING[name]
    kiln.reset()
    compiled = kiln.compile(fn, options={"debug": True})
    good = torch.tensor([1, 9, 0, 4])
    torch.testing.assert_close(compiled(good), fn(good), rtol=0, atol=0)
    index = torch.tensor([1, bad, 2])
    try:
        fn(index)
        raised = None
    except (IndexError, RuntimeError) as e:
        raised = e
    if raised is None:  # negative indices count from the end where eager allows them
        torch.testing.assert_close(compiled(index), fn(index), rtol=0, atol=0)
        return
    with pytest.raises(error or type(raised), match="out of"):
        compiled(index)


def test_gather_refuses_negative_indices_as_eager():
    fn = INDEXING["gather"][0]
    kiln.reset()
    with pytest.raises(RuntimeError, match="out of bounds"):
        fn(torch.tensor([-1]))
    with pytest.raises(RuntimeError, match="out of bounds"):
        kiln.compile(fn, options={"debug": True})(torch.tensor([-1]))


def unclamped_slice_start(ctx, start, size):
    """The slice start before clamping was fixed: size + start, which runs past the front."""
    return size + start if start is not None and start < 0 else (start or 0)


def test_bounds_checks_name_the_kernel_and_buffer_of_a_bad_access(monkeypatch):
    monkeypatch.setattr(lowerings, "slice_start", unclamped_slice_start)
    kiln.reset()
    compiled = kiln.compile(lambda x: x[-512:] * 2, dynamic=True,
                            options={"debug": True, "debug_bounds_checks": True})
    with pytest.raises(KernelBoundsError, match=r"kiln kernel kiln_\w+_\d+ read buffer arg0 out of bounds"):
        compiled(randn(100, 4))


def test_bounds_checks_follow_the_environment(monkeypatch):
    monkeypatch.setenv("KILN_BOUNDS_CHECK", "1")
    x = randn(5, 3)
    compiled = compile_fx(torch.fx.symbolic_trace(lambda x: x * 2 + 1), [x], {"graph_cache": False})
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert "kiln_checked_load(" in compiled.kiln_source


def test_cat_and_pad_of_parts_that_may_be_empty_when_they_run():
    # cat and pad load every part at a clamped index; a part of symbolic length s - 2 (here a
    # buffer of its own: two users) is empty at s = 2 and has no element to load: aten cats it
    def cat(x):
        part = (x[:x.size(0) - 2] * 2).exp()
        return torch.cat([part, x]), part.sin()

    def pad(x):
        part = (x[2:] * 2).exp()
        return F.pad(part, (1, 1)), part.sin()
    for fn in (cat, pad):
        check_calls(fn, [(randn(n, 3, seed=n),) for n in (5, 2, 3)], debug_bounds_checks=True)
