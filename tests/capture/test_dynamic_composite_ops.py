"""Composite ops on symbolic sizes stay symbolic: F.pad with a pad that depends on nothing but constants,
baddbmm over a symbolic batch of rows, min()/max() (torch.sym_min/sym_max), int()/float() and slice() of
sizes, compile once for every sequence length after the first
(static, then automatic dynamic), equal to eager. They used to pin the size to its current value and
recompile for every length (MobileBERT; Bloom's attention; MPT's position bias; LongT5's windows; BEiT's bias table)."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from tests.utils import check_calls

LENGTHS = (8, 12, 17, 20)


def shifted_neighbours(x):
    """MobileBERT's trigram embedding: each position next to its neighbours."""
    return torch.cat([F.pad(x[:, 1:], [0, 0, 0, 1, 0, 0], value=0.0), x,
                      F.pad(x[:, :-1], [0, 0, 1, 0, 0, 0], value=0.0)], dim=2)


def pad_both_ends(x):
    return F.pad(x, (2, 3), value=-1.0).relu()


def alibi_scores(q, k, bias):
    """Bloom's attention scores: baddbmm of a broadcast bias and q @ k^T."""
    return torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=0.5)


def test_pad_of_a_sliced_sequence():
    calls = [(torch.randn(2, n, 4),) for n in LENGTHS]
    check_calls(shifted_neighbours, calls, graphs=2)


def test_pad_of_the_symbolic_dim_itself():
    calls = [(torch.randn(3, n),) for n in LENGTHS]
    check_calls(pad_both_ends, calls, graphs=2)


def test_baddbmm_with_broadcast_bias():
    calls = [(torch.randn(4, n, 8), torch.randn(4, n, 8), torch.randn(4, 1, n)) for n in LENGTHS]
    check_calls(alibi_scores, calls, graphs=2)


def test_pad_dynamic_true_one_compile():
    calls = [(torch.randn(2, n, 4),) for n in LENGTHS]
    check_calls(shifted_neighbours, calls, graphs=1, dynamic=True)


def bias_window(x, bias):
    """MPT's attention: a position bias longer than the sequence, sliced from max(0, rows - length)."""
    start = max(0, bias.size(1) - x.shape[1])
    return x + bias[:, start:start + x.shape[1]], start


def capped_lengths(x):
    """min/max of sizes and constants, over arguments and over a list; the cap (16) is crossed at 17.
    (Not a slice end: slicing to a Min guards on whether it reaches the end, in torch.compile too.)"""
    n = min(x.shape[1], 16)
    widest = max([x.shape[0], x.shape[1], 3])
    return x * n + widest, n, widest


def test_max_of_a_size_as_a_slice_start():
    calls = [(torch.randn(2, n), torch.randn(2, 24)) for n in LENGTHS]
    check_calls(bias_window, calls, graphs=2)


def test_min_max_of_sizes_stay_symbolic():
    calls = [(torch.randn(2, n),) for n in LENGTHS]
    check_calls(capped_lengths, calls, graphs=2)


def test_min_max_of_sizes_return_ints():
    compiled = kiln.compile(capped_lengths, backend="eager", dynamic=True)
    for n in (8, 20):
        _, cap, widest = compiled(torch.randn(2, n))
        assert (type(cap), type(widest)) == (int, int) and (cap, widest) == (min(n, 16), n)


@pytest.mark.torch_differs("torch.compile returns 3.0 for max(3, 2.5) (torch.sym_max promotes to float)")
def test_max_of_an_int_size_and_a_float_keeps_python_types():
    """max(n, 2.5) is an int when n wins and a float when 2.5 wins (torch.sym_max would give floats):
    eager's values and types."""
    def fn(x):
        return x * 2, max(x.shape[0], 2.5), min(x.shape[0], 2.5)
    compiled = kiln.compile(fn, backend="eager")
    for n in (1, 3, 5, 7):
        got, want = compiled(torch.randn(n)), fn(torch.randn(n))
        assert got[1:] == want[1:] and [type(v) for v in got[1:]] == [type(v) for v in want[1:]]


def three_shifted_windows(x, block=5):
    """LongT5's local attention: the length padded to whole blocks, blocks padded by one on each side,
    and three windows cut with slice() objects kept in a list (not the slice syntax)."""
    x = F.pad(x, (0, 0, 0, -x.shape[1] % block))
    blocks = x.reshape(x.shape[0], x.shape[1] // block, block, x.shape[2])
    count = blocks.shape[1]
    padded = F.pad(blocks, (0, 0, 0, 0, 1, 1))
    windows = []
    for i in range(3):
        index = [slice(0, None)] * padded.ndim
        index[1] = slice(i, i + count)
        windows.append(padded[tuple(index)])
    return torch.cat(windows, dim=2)


def slice_objects_of_sizes(x, items):
    n = x.shape[0]
    head, tail, every_other = slice(n // 2), slice(n // 2, None), slice(0, n, 2)
    return x[head] + x[tail][: n // 2], x[every_other], items[head], (head.stop, tail.start)


def test_slice_objects_with_symbolic_bounds():
    calls = [(torch.randn(2, n, 3),) for n in LENGTHS]
    check_calls(three_shifted_windows, calls, graphs=2)


def test_slice_objects_index_tensors_and_lists():
    """slice(stop), slice(start, None) and slice(start, stop, step) of a size index tensors
    symbolically; a Python list indexed by one, and its bounds read back, give eager's values."""
    calls = [(torch.randn(n), list(range(20))) for n in (8, 12, 16)]
    check_calls(slice_objects_of_sizes, calls)


def resized_bias_table(x, table):
    """BEiT's relative position bias for another image size: the table interpolated to a size computed
    with int() (transformers' torch_int), and the numbers returned."""
    side = int(x.shape[1] // 8 * 2 - 1)
    third = float(x.shape[1]) / 3
    resized = F.interpolate(table[None, None], size=(int(side), table.shape[1]), mode="bilinear")
    return x[:, :1] + resized.sum(), side, third, int(x.shape[1] / 3)


def test_int_and_float_of_sizes_stay_symbolic():
    calls = [(torch.randn(2, n), torch.randn(5, 4)) for n in (16, 24, 40, 41)]
    check_calls(resized_bias_table, calls, graphs=2)


def test_int_and_float_of_sizes_keep_python_types():
    compiled = kiln.compile(resized_bias_table, backend="eager", dynamic=True)
    for n in (16, 41):
        x, table = torch.randn(2, n), torch.randn(5, 4)
        got, want = compiled(x, table)[1:], resized_bias_table(x, table)[1:]
        assert got == want and [type(v) for v in got] == [type(v) for v in want]
