"""Numbers read out of tensor data under fullgraph=True, as torch.compile 2.13 treats them: `item()` and
`tolist()` go into the one graph (as with capture_scalar_outputs), a Python `assert` on such a number
becomes a check the graph runs on every call (torch.compile raises RuntimeError from it; eager raises
AssertionError), and sizes made of such numbers (`x.split(sizes.tolist())`, as in Hugging Face JetMoE)
stay symbolic. Without fullgraph and capture_scalar_outputs, both are graph breaks, as before.

PYTEST_DONT_REWRITE: the programs' `assert` statements must stay Python's own bytecode."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from tests.utils import CompileCounter, check_calls


def ints(*values):
    return torch.tensor(values)


def scaled_by_sum(x):
    return x * x.sum().item()


def sum_and_max(x):
    return x + 1, x.sum().item(), x.max().item()


@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
def test_item_under_fullgraph_is_one_graph(backend):
    # each call a new value: a number folded in at the first call would give a stale answer
    calls = [(torch.randn(4),), (torch.randn(4) * 3,), (-torch.ones(4),)]
    counter = check_calls(scaled_by_sum, calls, backend=backend, fullgraph=True)
    assert counter is None or counter.frame_count == 1
    check_calls(sum_and_max, [(ints(1, 5, 2),), (ints(7, 0, 3),), (ints(-4, -2, -9),)], graphs=1, fullgraph=True)


def nested(x):
    rows = x.tolist()
    return rows, x * rows[1][0] + rows[0][2]


def flat(x):
    values = x.tolist()
    return x[: 2] * values[0] - values[1], values


def scalar(x):
    return x.tolist() + 1


@pytest.mark.parametrize("backend", [None, "inductor"])
def test_tolist_under_fullgraph_is_one_graph(backend):
    calls = [(torch.arange(6).reshape(2, 3),), (torch.arange(6).reshape(2, 3) * -2,), (torch.full((2, 3), 7),)]
    counter = check_calls(nested, calls, backend=backend, fullgraph=True)
    assert counter is None or counter.frame_count == 1
    check_calls(flat, [(torch.tensor([1.5, -2.0]),), (torch.tensor([0.25, 4.0]),)], graphs=1, fullgraph=True)
    check_calls(scalar, [(torch.tensor(3),), (torch.tensor(-8),)], graphs=1, fullgraph=True)


def test_tolist_with_capture_scalar_outputs_is_one_graph():
    with kiln.config.patch(capture_scalar_outputs=True):
        check_calls(nested, [(torch.arange(6).reshape(2, 3),), (torch.arange(6).reshape(2, 3) + 5,)], graphs=1)


def test_without_fullgraph_item_and_tolist_still_break():
    # a graph before each break; the rest resumes with the value as a constant (one graph per value)
    counter = check_calls(nested, [(torch.arange(6).reshape(2, 3),), (torch.arange(6).reshape(2, 3) + 5,)])
    assert counter.frame_count >= 2
    explained = kiln.explain(nested)(torch.arange(6).reshape(2, 3))
    assert any("tolist" in str(r) for r in explained.break_reasons)
    explained = kiln.explain(scaled_by_sum)(torch.randn(3))
    assert any("item" in str(r) for r in explained.break_reasons)


def test_branch_on_item_under_fullgraph_is_an_error():
    def branch(x):
        if x.sum().item() > 0:
            return x + 1
        return x - 1
    with pytest.raises(kiln.Unsupported, match="item"):
        kiln.compile(branch, backend="eager", fullgraph=True)(torch.ones(3))


# ---- assert on a number read from tensor data -------------------------------------------------------

def at_most(x, n):
    assert x.max().item() <= n
    return x + 1


def not_above(x, n):
    assert not x.max().item() > n, "too large"
    return x * 2


def in_range(x, n):
    top = x.max().item()
    assert top >= 0 and top <= n
    return x - top


def float_at_most(x):
    assert x.abs().max().item() < 2.5  # (torch.compile 2.13 drops this check on a float: kiln keeps it)
    return x.sin()


def check_assert(fn, calls, backend=None):
    """Each call: compiled passes with eager's result where eager's assert holds, and raises where it
    fails, on every call of the one graph (never a check done once at capture)."""
    counter = CompileCounter() if backend is None else None
    compiled = kiln.compile(fn, backend=counter or backend, fullgraph=True)
    for args in calls:
        try:
            expected = fn(*args)
        except AssertionError:
            with pytest.raises(RuntimeError, match="assert failed"):
                compiled(*args)
            continue
        torch.testing.assert_close(compiled(*args), expected)
    assert counter is None or counter.frame_count == 1


@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
def test_assert_on_item_is_checked_when_the_graph_runs(backend):
    calls = [(ints(1, 4, 2), 5), (ints(1, 9, 2), 5), (ints(5, 0, 1), 5), (ints(6, 0, 1), 5), (ints(0, 0, 0), 5)]
    check_assert(at_most, calls, backend)
    check_assert(not_above, calls, backend)
    check_assert(in_range, calls + [(ints(-1, -3, -2), 5)], backend)


def test_assert_on_a_float_item():
    check_assert(float_at_most, [(torch.tensor([0.5, -2.0]),), (torch.tensor([0.5, -3.0]),), (torch.tensor([2.4, 0.0]),)])


def test_assert_message_names_the_line():
    compiled = kiln.compile(at_most, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(ints(3, 1), 4), at_most(ints(3, 1), 4))
    with pytest.raises(RuntimeError, match=r"assert failed at .*test_data_scalars.py:\d+"):
        compiled(ints(3, 8), 4)


def test_assert_with_capture_scalar_outputs_without_fullgraph():
    with kiln.config.patch(capture_scalar_outputs=True):
        counter = CompileCounter()
        compiled = kiln.compile(at_most, backend=counter)
        torch.testing.assert_close(compiled(ints(1, 2), 3), at_most(ints(1, 2), 3))
        with pytest.raises(RuntimeError):
            compiled(ints(1, 7), 3)
        assert counter.frame_count == 1


def halves_when_sized(x):
    n = x.sum().item()
    torch._check_is_size(n)
    if n >= 0:  # what the check makes known: no branch on data left
        return x * 2 + n
    return x * 3


def capped(x, cap):
    n = x.max().item()
    torch._check(n < cap)
    torch._check(n >= 1, lambda: "needs one")
    return torch.ones(n).cumsum(0) * x.sum()


@pytest.mark.parametrize("backend", [None, "inductor"])
def test_torch_checks_on_item_are_checked_when_the_graph_runs(backend):
    """torch._check / _check_is_size on a number read out of tensor data under fullgraph: one graph
    that checks it on every call (RuntimeError, as eager's check raises), and what a check makes
    known decides a later branch on the number."""
    counter = check_calls(halves_when_sized, [(ints(1, 2),), (ints(4, 4),), (ints(-5, 1),), (ints(0, 3),)],
                          backend=backend, fullgraph=True)
    assert counter is None or counter.frame_count == 1
    counter = check_calls(capped, [(ints(3, 1), 6), (ints(2, 2), 6), (ints(7, 1), 6), (ints(0, 0), 6), (ints(5, 1), 6)],
                          backend=backend, fullgraph=True)
    assert counter is None or counter.frame_count == 1


# ---- sizes made of such numbers --------------------------------------------------------------------

WEIGHTS = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))


def experts(h, choice):
    """A mixture-of-experts step in JetMoE's shape: rows grouped by expert, split by counts read out of
    a tensor, one linear per expert, put back in order."""
    counts = torch.zeros(h.size(0), 3, dtype=torch.long).scatter(1, choice[:, None], 1).sum(0).tolist()
    order = choice.argsort(stable=True)
    parts = h[order].split(counts, dim=0)
    out = torch.cat([F.linear(parts[i], WEIGHTS[i]) for i in range(3)], 0)
    return torch.zeros(h.size(0), 5).index_add(0, order, out)


def routed(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize("backend", [None, "inductor"])
def test_split_by_sizes_read_from_a_tensor(backend):
    calls = [routed(6, 0), routed(6, 1), routed(9, 2), routed(11, 3)]
    check_calls(experts, calls, backend=backend, fullgraph=True, rtol=1e-4, atol=1e-5)


def split_and_sizes(x, sizes):
    head, tail = x.split(sizes.tolist())
    return head * 2, tail.shape, tail.sum(), tail


@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
def test_sizes_of_split_pieces_reach_python(backend):
    """The pieces' sizes (numbers only the graph knows) come back as the real sizes of each call, and the
    pieces are views of the input, as in eager (writing through one changes the input)."""
    calls = [(torch.arange(5.), ints(2, 3)), (torch.arange(5.), ints(4, 1)), (torch.arange(5.), ints(0, 5))]
    counter = check_calls(split_and_sizes, calls, backend=backend, fullgraph=True)
    assert counter is None or counter.frame_count == 1
    x = torch.arange(5.)
    tail = kiln.compile(split_and_sizes, backend=backend or "eager", fullgraph=True)(x, ints(3, 2))[3]
    tail.add_(10)
    assert x.tolist() == [0, 1, 2, 13, 14]


def test_split_by_wrong_sizes_raises_as_eager_does():
    def split(x, sizes):
        return x.split(sizes.tolist())
    counter = CompileCounter()
    compiled = kiln.compile(split, backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(torch.arange(5.), ints(2, 3)), split(torch.arange(5.), ints(2, 3)))
    with pytest.raises(RuntimeError):
        split(torch.arange(5.), ints(2, 2))
    with pytest.raises(RuntimeError) as caught:
        compiled(torch.arange(5.), ints(2, 2))
    assert not isinstance(caught.value, kiln.Unsupported) and counter.frame_count == 1


def test_op_making_a_data_dependent_size_is_still_refused():
    def nonzero(x):
        return x.nonzero() + x.sum().item()
    with pytest.raises(kiln.Unsupported, match="data-dependent output shape"):
        kiln.compile(nonzero, backend="eager", fullgraph=True)(ints(0, 1, 2))


def item_plus_one(x):
    return x.item() + 1


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_item_of_a_0d_input_is_never_its_first_value(fullgraph, dtype):
    # torch 2.14's fake tensor of a 0-d CPU int64/float64 input holds the real value, and item() on
    # it returned that value: the first call's number was folded into the graph for good
    calls = [(torch.tensor(3, dtype=dtype),), (torch.tensor(-8, dtype=dtype),), (torch.tensor(5, dtype=dtype),)]
    check_calls(item_plus_one, calls, fullgraph=fullgraph)
    check_calls(scalar, calls, fullgraph=fullgraph)
