"""A costly lazy value broadcast over many more elements is computed once into a buffer of its own
(lowering_base.BROADCAST_REUSE), and eval batch norm is a per-channel scale and shift, as eager's CPU
kernel computes it (decompositions._eval_batch_norm). Every case against eager."""
import pytest
import torch
import torch.nn.functional as F

from tests.compiler.test_compile_fx import check


def per_element_kernels(c, numel):
    return [k for k in c.kiln_kernels if k.numel == numel]


def batch_norm_relu(x, mean, var, w, b):
    return torch.relu(F.batch_norm(x, mean, var, w, b, training=False, eps=1e-3))


def batch_norm_args(shape, dtype=torch.float32):
    torch.manual_seed(0)
    c = shape[1]
    return (torch.randn(shape, dtype=dtype), torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5,
            torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype))


def test_eval_batch_norm_scale_is_computed_per_channel():
    c = check(batch_norm_relu, *batch_norm_args((2, 16, 12, 12)))
    assert per_element_kernels(c, 16), c.kiln_kernels  # weight / sqrt(var + eps): one loop over channels


def test_eval_batch_norm_shift_is_computed_per_channel_too():
    # bias - mean * scale: the same loop over channels makes it, so each pixel does one multiply-add
    c = check(batch_norm_relu, *batch_norm_args((2, 16, 12, 12)))
    assert sum(len(k.buffers) for k in per_element_kernels(c, 16)) == 2, c.kiln_kernels


@pytest.mark.parametrize("shape", [(4, 8), (2, 8, 20), (2, 8, 4, 5, 6)])
def test_eval_batch_norm_any_rank(shape):
    check(batch_norm_relu, *batch_norm_args(shape))


def test_eval_batch_norm_float64_and_without_affine():
    check(batch_norm_relu, *batch_norm_args((2, 8, 6, 6), torch.float64))
    check(lambda x, m, v: F.batch_norm(x, m, v, training=False), *batch_norm_args((2, 8, 6, 6))[:3])


def test_costly_broadcast_value_is_computed_once():
    c = check(lambda x, w: x * torch.exp(w).sin()[None, :], torch.randn(64, 32), torch.randn(32))
    assert per_element_kernels(c, 32), c.kiln_kernels


def test_cheap_broadcast_value_stays_in_its_consumer():
    c = check(lambda x, w: x * (w + 1)[None, :], torch.randn(64, 32), torch.randn(32))
    assert len(c.kiln_kernels) == 1, c.kiln_kernels
