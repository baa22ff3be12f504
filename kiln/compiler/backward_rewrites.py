"""Backward formulas whose traced form computes other values than eager's CPU kernel, rewritten in
the joint graph to eager's.

Autograd's `evenly_distribute_backward` (the gradient of the full reductions `x.max()`, `x.min()`,
`x.median()`, `x.nanmedian()`) has two forms. Traced (fake tensors are subclass-like) and on CUDA it
is `mask * (grad / mask.sum())`; on CPU eager it is `zeros.masked_fill_(mask, grad / mask.sum())`.
They differ where the gradient is not finite: `0 * nan` is NaN, so every element but the maximum
got a NaN gradient where eager's is 0. The traced form is recognised by its mask,
`(x == v) | (isnan(x) & isnan(v))`, and its product becomes `where(mask, grad / count, 0)`.
"""
import torch

aten = torch.ops.aten


def as_eager_on_cpu(gm):
    """Rewrite `gm` (a joint aten graph) in place where its formulas differ from eager's on CPU."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.mul.Tensor and _is_even_distribution(node):
            mask, share = node.args
            with gm.graph.inserting_before(node):
                where = gm.graph.call_function(aten.where.ScalarOther, (mask, share, 0.0))
            where.meta = dict(node.meta)
            node.replace_all_uses_with(where)
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()
    return gm


def _is_even_distribution(mul):
    """Whether `mul` is `mask * (grad / mask.sum())` with evenly_distribute_backward's mask, on CPU."""
    mask, share = mul.args
    if not (_is_node(mask, aten.logical_or.default) and _is_node(share, aten.div.Tensor)):
        return False
    equal, both_nan = mask.args
    if not (_is_node(equal, aten.eq.Tensor) and _is_node(both_nan, aten.logical_and.default)):
        return False
    if not all(_is_node(n, aten.isnan.default) for n in both_nan.args):
        return False
    if [n.args[0] for n in both_nan.args] != list(equal.args):
        return False
    count = share.args[1]
    if not (_is_node(count, aten.sum.dim_IntList, aten.sum.default) and count.args[0] is mask):
        return False
    value = mul.meta.get("val")
    return value is None or value.device.type == "cpu"


def _is_node(node, *targets):
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets
