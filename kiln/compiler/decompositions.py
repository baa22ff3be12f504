"""The decomposition table the aot trace uses before lowering.

Start from torch's core-ATen table (composite ops broken into ~200 core ops), then:
- keep heavy ops whole, so the wrapper calls aten's tuned kernels for them (BLAS, oneDNN, flash
  attention): decomposing a matrix-vector product into mul+sum loses to BLAS;
- add decompositions of core ops whose parts fuse better than a whole-op extern call (softmax,
  layer/group/batch norm, gelu, dropout, ...): two reductions and pointwise epilogues. Not
  `mean`: torch's decomposition of it is written in prims (prims.sum, prims.div), which lowering
  does not know;
- with `fallback_random`, keep every random op whole, so aten draws the same numbers as eager.
"""
import functools

import torch
from torch._decomp import core_aten_decompositions, decomposition_table

aten = torch.ops.aten

# Packets (all overloads) that stay whole: aten runs them faster than fused loops would.
KEEP_WHOLE = (
    aten.mm, aten.addmm, aten.bmm, aten.mv, aten.dot, aten.vdot, aten.convolution,
    aten.scaled_dot_product_attention, aten._scaled_dot_product_attention_math,
    aten._scaled_dot_product_flash_attention_for_cpu, aten.embedding_bag,
)

# Core ops torch keeps whole that kiln breaks up: their parts are reductions and pointwise ops
# that fuse with their neighbours.
FUSIBLE_EXTRAS = (
    aten._softmax.default, aten._log_softmax.default,
    aten.native_layer_norm.default, aten.native_group_norm.default,
    aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit_no_training.default, aten._batch_norm_with_update.default,
    aten._batch_norm_with_update_functional.default, aten._batch_norm_no_update.default,
    aten.gelu.default, aten._addmm_activation.default, aten.addmv.default,
    aten.linalg_vector_norm.default,
    aten.embedding.default, aten.native_dropout.default, aten.dropout.default,
)


def _copy(self, src, non_blocking=False):
    """aten.copy (what functionalization makes of `x.copy_(src)`): src cast to x's dtype,
    broadcast to x's shape, as a tensor of its own: never a view of src (an output aliasing src
    would see src's later in-place changes, which x in eager does not), and never an expanded
    one (x's new value with stride-0 dims: a later write into a view of x, `x[..., :1] = v`, would
    write into a tensor whose elements share memory, which functionalization refuses)."""
    return _in_dim_order_of(self, aten.expand_copy.default(src.to(dtype=self.dtype, device=self.device),
                                                           list(self.shape)))


def _in_dim_order_of(like, t):
    """`t` laid out in `like`'s dim order. Eager's copy_ writes into x's memory, so x keeps its
    layout; a new value laid out as src was (a transposed gradient written into a contiguous
    buffer) makes a later `view` of it one eager could take and the trace cannot ("Cannot view a
    tensor with shape ... and strides ..."). Static strides only: ordering symbolic ones would guard."""
    strides, have = like.stride(), t.stride()
    if t.dim() < 2 or tuple(have) == tuple(strides) or \
            not all(type(s) is int for s in (*strides, *have, *like.shape)):
        return t
    order = sorted(range(like.dim()), key=lambda d: -strides[d])  # outermost first (stable for ties)
    if order == sorted(range(t.dim()), key=lambda d: -have[d]) and t.is_contiguous() == like.is_contiguous():
        return t
    back = sorted(range(len(order)), key=lambda d: order[d])
    return aten.clone.default(t.permute(order), memory_format=torch.contiguous_format).permute(back)


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """aten.embedding as a gather of rows that refuses negative indices, as eager's embedding does
    (torch's decomposition indexes weight[indices] for 2-d indices, which counts them from the end)."""
    if weight.dim() != 2:
        return NotImplemented
    return weight.index_select(0, indices.reshape(-1)).view(*indices.shape, weight.shape[1])


def _pow_bool(self, exponent):
    """bool ** bool: eager keeps bool (x ** False is all True, x ** True is x), where torch's meta
    function, which the trace follows, says int64. Other cases: the op as it is."""
    if self.dtype == torch.bool and isinstance(exponent, bool):
        return self.clone() if exponent else torch.ones_like(self)
    return NotImplemented


def _eval_batch_norm(input, weight, bias, running_mean, running_var, eps):
    """Eval batch norm as eager's CPU kernel computes it: a scale and a shift per channel
    (alpha = weight / sqrt(var + eps), beta = bias - mean * alpha), then input * alpha + beta: one
    multiply-add per element (lowering computes alpha and beta once per channel, see
    lowering_base.BROADCAST_REUSE). None where torch's decomposition applies instead: other
    devices (their saved statistics are tensors of their own) and reduced-precision inputs."""
    if input.dtype not in (torch.float32, torch.float64) or input.dim() < 2 or input.device.type != "cpu":
        return None
    alpha = 1 / torch.sqrt(running_var + eps)
    if weight is not None:
        alpha = alpha * weight
    beta = -running_mean * alpha
    if bias is not None:
        beta = beta + bias
    shape = [1, -1] + [1] * (input.dim() - 2)
    return input * alpha.view(shape) + beta.view(shape)


def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out = _eval_batch_norm(input, weight, bias, running_mean, running_var, eps)
    if out is None:
        return decomposition_table[aten._batch_norm_no_update.default](
            input, weight, bias, running_mean, running_var, momentum, eps)
    # (the reserve tensor is cudnn's alone: empty on the CPU, the only device this path takes)
    return out, input.new_zeros((0,)), input.new_zeros((0,)), input.new_empty((0,), dtype=torch.uint8)


def _batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    out = _eval_batch_norm(input, weight, bias, running_mean, running_var, eps)
    if out is None:
        return decomposition_table[aten._native_batch_norm_legit_no_training.default](
            input, weight, bias, running_mean, running_var, momentum, eps)
    return out, input.new_zeros((0,)), input.new_zeros((0,))


def _native_batch_norm(op):
    """native_batch_norm and _native_batch_norm_legit (same arguments): eval mode as
    _eval_batch_norm, training as torch decomposes it."""
    def decompose(input, weight, bias, running_mean, running_var, training, momentum, eps):
        out = None if training or running_mean is None or running_var is None else \
            _eval_batch_norm(input, weight, bias, running_mean, running_var, eps)
        if out is None:
            return decomposition_table[op](input, weight, bias, running_mean, running_var, training, momentum, eps)
        return out, input.new_zeros((0,)), input.new_zeros((0,))
    return decompose


_SQRT_HALF = 0.70710678118654752440
_TANH_BETA = 0.79788456080286535588  # sqrt(2 / pi)
_TANH_KAPPA = 0.044715


def _in_opmath(fn):
    """fn computed in float for bfloat16/float16 tensors and rounded once, as eager's kernels do."""
    @functools.wraps(fn)
    def run(*args, approximate="none"):
        half = args[-1].dtype in (torch.float16, torch.bfloat16)
        out = fn(*(a.float() if half else a for a in args), approximate=approximate)
        return out.to(args[-1].dtype) if half else out
    return run


@_in_opmath
def _gelu(a, approximate="none"):
    """gelu in a form that does not cancel: torch's a/2 * (1 + erf(a/sqrt2)) loses half its digits
    at a = -5 and all at a = -8 (erf rounds to -1), where a/2 * erfc(-a/sqrt2) keeps them; the tanh
    form likewise as a * sigmoid(2u) (= a/2 * (1 + tanh(u)))."""
    if approximate == "tanh":
        return a * torch.sigmoid(2 * _TANH_BETA * (a + _TANH_KAPPA * a * a * a))
    return a * 0.5 * torch.erfc(a * -_SQRT_HALF)


@_in_opmath
def _gelu_backward(grad, a, approximate="none"):
    """gelu's derivative without the same cancellation (see _gelu): the normal cdf as erfc, and
    for tanh, 1 + tanh(u) = 2 sigmoid(2u) and 1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u)."""
    if approximate == "tanh":
        u2 = 2 * _TANH_BETA * (a + _TANH_KAPPA * a * a * a)
        s, s_neg = torch.sigmoid(u2), torch.sigmoid(-u2)
        du = _TANH_BETA * (1 + 3 * _TANH_KAPPA * a * a)
        return grad * (s + 2 * a * s * s_neg * du)
    cdf = 0.5 * torch.erfc(a * -_SQRT_HALF)
    pdf = (0.5 * _SQRT_HALF * 1.12837916709551257390) * torch.exp(a * a * -0.5)  # 1 / sqrt(2 pi)
    return grad * (cdf + a * pdf)


def _constant_pad_nd(x, pad, value=0):
    """constant_pad_nd with sizes or pads that are symbolic: ATen's own kernel (what tracing runs,
    and what the backward of a pad is: the same pad negated) reads them as plain ints and fails.
    Negative pads become narrows (slices take symbolic bounds), the rest a pad of non-negative
    amounts (which tracing runs as is, and kiln lowers); plain ints keep the op whole."""
    if not any(isinstance(v, torch.SymInt) for v in (*pad, *x.shape)) or not any(p < 0 for p in pad):
        return NotImplemented
    rest = []
    for k, (before, after) in enumerate(zip(pad[::2], pad[1::2])):
        dim = x.ndim - 1 - k
        if before < 0:
            x = x.narrow(dim, -before, x.shape[dim] + before)
        if after < 0:
            x = x.narrow(dim, 0, x.shape[dim] + after)
        rest += [before if before >= 0 else 0, after if after >= 0 else 0]
    if all(isinstance(v, int) and v == 0 for v in rest):
        return x.clone()
    return aten.constant_pad_nd.default(x, rest, value)


@functools.lru_cache(maxsize=2)
def _table(fallback_random):
    table = dict(core_aten_decompositions().items())
    table.update((op, decomposition_table[op]) for op in FUSIBLE_EXTRAS)
    table[aten.copy.default] = _copy
    table[aten.embedding.default] = _embedding
    table[aten.pow.Tensor_Scalar] = _pow_bool
    table[aten.gelu.default] = _gelu
    table[aten.constant_pad_nd.default] = _constant_pad_nd
    table[aten._batch_norm_no_update.default] = _batch_norm_no_update
    table[aten._native_batch_norm_legit_no_training.default] = _batch_norm_legit_no_training
    for op in (aten.native_batch_norm.default, aten._native_batch_norm_legit.default):
        table[op] = _native_batch_norm(op)
    table[aten.gelu_backward.default] = _gelu_backward
    whole = {getattr(p, o) for p in KEEP_WHOLE for o in p.overloads()}
    return {op: fn for op, fn in table.items()
            if op not in whole and not (fallback_random and _is_random(op))}


def _is_random(op):
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def lowering_decompositions(fallback_random: bool = False) -> dict:
    """The decomposition table for lowering (a fresh dict: callers may extend it)."""
    return dict(_table(fallback_random))
