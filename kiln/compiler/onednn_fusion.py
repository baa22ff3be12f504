"""Frozen convolutions as oneDNN calls: the weight reordered once into oneDNN's blocked layout
(`mkldnn._reorder_convolution_weight`), and the activation after the convolution applied by oneDNN
as it writes the result (`mkldnn._convolution_pointwise`, a post-op): one pass over the output
where aten's convolution and a kernel after it make two. What torch.compile does for convolutions
under freezing on CPU; only for weights that are constants (freezing), as the packed weight is made
at compile time.

`prepack_convolutions(gm)` rewrites the channels-last aten graph layout_opt made: each 2-d float32
convolution with a frozen weight (and bias) becomes `mkldnn._convolution_pointwise(x, packed, b,
..., attr, scalars, algorithm)`, with attr the activation it absorbs (its only user) or "none". The
packed weight is an opaque (non-strided) tensor: lowering passes it to the call as it is.
"""
import torch

from kiln.compiler.freezing import is_frozen

aten = torch.ops.aten


def available():
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and \
        hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def _activation(node):
    """(attr, scalars, algorithm) of oneDNN's post-op for activation `node`, or None."""
    target, args = node.target, node.args
    if target in (aten.relu.default, aten.relu_.default):
        return "relu", [], None
    if target in (aten.hardtanh.default, aten.hardtanh_.default):
        return "hardtanh", [args[1] if len(args) > 1 else -1.0, args[2] if len(args) > 2 else 1.0], None
    if target in (aten.silu.default, aten.silu_.default):
        return "swish", [], None
    if target in (aten.hardswish.default, aten.hardswish_.default):
        return "hardswish", [], None
    if target is aten.sigmoid.default:
        return "sigmoid", [], None
    if target is aten.tanh.default:
        return "tanh", [], None
    if target is aten.gelu.default:
        return "gelu", [], node.kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    return None


def prepack_convolutions(gm):
    """Rewrite `gm` in place (see the module doc); returns how many convolutions it rewrote."""
    count = 0
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default:
            continue
        x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
        x_meta, meta = x.meta.get("val"), conv.meta.get("val")
        if (transposed or not is_frozen(weight) or (bias is not None and not is_frozen(bias))
                or not isinstance(x_meta, torch.Tensor) or x_meta.dim() != 4 or x_meta.dtype != torch.float32
                or meta is None):
            continue
        users = list(conv.users)
        post = _activation(users[0]) if len(users) == 1 else None
        last = users[0] if post is not None else conv
        attr, scalars, algorithm = post or ("none", [], None)
        w = getattr(gm, weight.target)
        packed = torch.ops.mkldnn._reorder_convolution_weight(w, list(padding), list(stride), list(dilation), groups,
                                                                list(x_meta.shape))
        name = f"{weight.target}_packed"
        gm.register_buffer(name, packed)
        with gm.graph.inserting_before(conv):
            packed_node = gm.graph.get_attr(name)  # no fake value: an opaque tensor
            call = gm.graph.call_function(torch.ops.mkldnn._convolution_pointwise.default,
                                          (x, packed_node, bias, list(padding), list(stride), list(dilation), groups,
                                           attr, scalars, algorithm))
        call.meta.update(last.meta)
        last.replace_all_uses_with(call)
        if last is not conv:
            gm.graph.erase_node(last)
        gm.graph.erase_node(conv)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count
