"""Composite ops on symbolic sizes stay symbolic: F.pad with a pad that depends on nothing but constants,
and baddbmm over a symbolic batch of rows, compile once for every sequence length after the first
(static, then automatic dynamic), equal to eager. They used to pin the size to its current value and
recompile for every length (MobileBERT; Bloom's attention)."""
import torch
import torch.nn.functional as F

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
