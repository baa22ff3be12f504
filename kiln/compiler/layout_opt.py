"""Channels-last convolutions: the layout a convolution net runs fastest in on CPU (oneDNN's native
layout: a depthwise or 1x1 convolution over NHWC memory skips the reorders an NCHW one pays; issue 15
measured MobileNetV2's convolutions 39 -> 25 ms), chosen once at compile time, as torch.compile does
on CPU (option `layout_optimization`).

`channels_last_convolutions(gm)` returns a copy of an inference aten graph in which every 2-d
convolution reads a channels-last input (`aten.clone(x, memory_format=channels_last)` in front of
it), with every node's fake value propagated again: the strides each value then has are eager's own
answer for a channels-last model (convolution outputs, the batch norm and activations after them,
concatenations of them), and lowering lays realized values out by them (ir.TensorValue.strides),
so the epilogue kernels and the next convolution read NHWC memory with no copy between them. Only
the graph's input (and any NCHW buffer reaching a convolution) is copied, once per call; the
graph's outputs keep the layouts the original graph gave them.
"""
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kiln.compiler.freezing import is_frozen
from kiln.compiler.lowerings import LAYOUT_CLONE
from kiln.debug.logs import log

aten = torch.ops.aten
CHANNELS_LAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A convolution runs on channels-last memory when its input has at least this many elements per
# weight element. oneDNN reorders an NCHW weight for an NHWC input on every call, which costs more
# than NHWC saves when the weight is large next to the activations (ResNet-18's 512x512x3x3
# convolutions at 7x7: 5.9 ms NCHW, 9.6 ms NHWC; its 64x64x3x3 ones at 56x56: 5.2 ms NCHW, 3.3 ms NHWC,
# one thread). With frozen weights (constants converted once at compile time) every one does.
CHANNELS_LAST_MIN_ACTIVATION_PER_WEIGHT = 2


def wants_channels_last(gm):
    """Whether the graph has a 2-d convolution on CPU (static sizes, a float dtype) and oneDNN is
    there to run it in channels-last memory."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    convolutions = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    return bool(convolutions) and all(_fits(n) for n in convolutions) and not _symbolic(gm)


def _fits(node):
    x, w = (a.meta.get("val") for a in node.args[:2])
    return all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.device.type == "cpu"
               and t.dtype in CHANNELS_LAST_DTYPES for t in (x, w))


def _symbolic(gm):
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
            return True
    return False


def runs_channels_last(node):
    """Whether convolution `node` runs on channels-last memory: always with a frozen weight (freezing
    lays it out channels-last once), else by the threshold above."""
    x, w = (a.meta["val"] for a in node.args[:2])
    return is_frozen(node.args[1]) or x.numel() >= CHANNELS_LAST_MIN_ACTIVATION_PER_WEIGHT * w.numel()


def channels_last_convolutions(gm):
    """(a copy of gm whose convolutions read inputs in the memory format they run fastest in, the
    fake values of the original graph's outputs), or (gm, None) when no convolution gains or the
    fake values cannot be propagated again."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    convolutions = [n for n in graph.nodes if n.target is aten.convolution.default]
    if not any(runs_channels_last(n) for n in convolutions):
        return gm, None
    for node in convolutions:
        # the others read NCHW memory: an epilogue after a channels-last one writes it so
        fmt = torch.channels_last if runs_channels_last(node) else torch.contiguous_format
        with graph.inserting_before(node):
            x = graph.call_function(aten.clone.default, (node.args[0],), {"memory_format": fmt})
        x.meta[LAYOUT_CLONE] = True
        node.update_arg(0, x)
    copy = torch.fx.GraphModule(gm, graph)
    outputs = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in _output_args(gm)]
    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            inputs = [_fresh(n.meta.get("val")) for n in copy.graph.nodes if n.op == "placeholder"]
        FakeTensorProp(copy, mode).propagate_dont_convert_inputs(*inputs)
    except Exception as e:  # a graph fake tensors cannot run again: it keeps eager's layouts
        log("perf_hints", "convolutions keep their layout: propagating channels-last strides raised %s: %s",
            type(e).__name__, e)
        return gm, None
    return copy, outputs


def _output_args(gm):
    return next(n for n in gm.graph.nodes if n.op == "output").args[0]


def _fresh(val):
    """A tensor of the fake mode in force, laid out as `val` (inputs keep their strides)."""
    if isinstance(val, torch.Tensor):
        return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device,
                                   requires_grad=val.requires_grad)
    return val
