"""freezing=True: an inference graph's parameters and buffers become constants of the compiled code.

Under `torch.no_grad()` (or inference mode), with `options={"freezing": True}`, the graph inputs that
are a module's parameters or buffers (capture marks them: placeholder meta "module_state"), except
those the graph writes, are baked into the aten graph as constants, and then:

- `fold_constants`: every op whose inputs are all constants runs once, now (batch norm's
  rsqrt(var + eps) * weight, a weight's transpose, dtype conversions);
- `fold_into_convolutions`: a convolution with constant weights followed by a per-channel multiply,
  divide, add or subtract of a constant (eval batch norm, after folding) becomes one convolution with
  new weights and bias;
- the convolutions' weights are laid out channels-last once (layout_opt runs every convolution in
  channels-last memory under freezing), and onednn_fusion hands them to oneDNN prepacked, with the
  activation after them fused into the call.

Soundness. torch.compile's freezing assumes the weights never change after compiling. kiln checks,
on every call, that each frozen input is the same tensor object with the same version counter
(`t._version`, which every in-place op on it bumps) as when it was frozen, and freezes and compiles
again when one is not: replacing a parameter (`m.conv.weight = nn.Parameter(...)`,
`load_state_dict` into a module, an optimizer step under no_grad) never gives a stale answer. What
no check sees, as in eager autograd: writes through `.data` (`p.data.copy_(w)`), which have their
own version counter. Under freezing, write weights with `torch.no_grad(): p.copy_(w)`.
"""
import operator

import torch
from torch.fx.node import map_arg

from kiln.debug.logs import log

aten = torch.ops.aten
FROZEN = "_frozen"  # the names of the constants freezing makes (inputs baked in, and what folds from them)


def frozen_positions(gm, example_inputs, mutated):
    """Positions of the graph inputs freezing bakes in: module parameters and buffers the graph does
    not write."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, (node, value) in enumerate(zip(placeholders, example_inputs))
            if node.meta.get("module_state") and isinstance(value, torch.Tensor) and i not in mutated]


class FrozenGraph:
    """Flat callable over all the graph's inputs that runs the graph compiled with the module
    tensors at `positions` as constants; re-freezes when one of them changed (see the module doc)."""

    def __init__(self, aten_gm, example_inputs, positions, compile_frozen):
        self.aten_gm, self.positions = aten_gm, positions
        self.kept = [i for i in range(len(example_inputs)) if i not in set(positions)]
        self.compile_frozen = compile_frozen  # (frozen aten gm, remaining example inputs) -> flat fn
        self.freeze(example_inputs)

    def freeze(self, args):
        self.expected = [(i, args[i], args[i]._version) for i in self.positions]
        gm = constant_graph(self.aten_gm, {i: args[i] for i in self.positions})
        fold_constants(gm)
        fold_into_convolutions(gm)
        channels_last_weights(gm)
        self.fn = self.compile_frozen(gm, [args[i] for i in self.kept])
        self.kiln_frozen_graph = gm  # what was compiled: the graph after folding (for inspection)
        for name in dir(self.fn):
            if name.startswith("kiln_"):
                setattr(self, name, getattr(self.fn, name))

    def __call__(self, *args):
        for i, tensor, version in self.expected:
            if args[i] is not tensor or tensor._version != version:
                log("perf_hints", "freezing: a frozen parameter or buffer was replaced or changed in place "
                    "since it was frozen; freezing and compiling again")
                log("recompiles", "freezing: input %d (a module tensor) is not the tensor that was frozen", i)
                self.freeze(args)
                break
        return self.fn(*[args[i] for i in self.kept])


def constant_graph(aten_gm, constants):
    """A copy of `aten_gm` whose placeholders at the positions in `constants` read those tensors as
    constants (get_attr) instead."""
    graph, values = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(aten_gm.graph, values))
    attrs = {n.target: _attr(aten_gm, n.target) for n in graph.nodes if n.op == "get_attr"}
    placeholders = [values[n] for n in aten_gm.graph.nodes if n.op == "placeholder"]
    for position, tensor in constants.items():
        node = placeholders[position]
        name = f"{FROZEN}{position}"
        attrs[name] = tensor.detach()
        with graph.inserting_before(node):
            constant = graph.get_attr(name)
        constant.meta.update(node.meta)
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
    return torch.fx.GraphModule(attrs, graph)


def is_frozen(node):
    """Whether fx node `node` reads a constant freezing made."""
    return isinstance(node, torch.fx.Node) and node.op == "get_attr" and node.target.startswith(FROZEN)


def _attr(module, target):
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _new_constant(gm, node, value, hint=FROZEN + "_folded"):
    """A get_attr node, inserted before `node`, for a new constant `value`."""
    name = f"{hint}{len(list(gm.graph.nodes))}"
    while hasattr(gm, name):
        name += "_"
    gm.register_buffer(name, value) if isinstance(value, torch.Tensor) else setattr(gm, name, value)
    with gm.graph.inserting_before(node):
        constant = gm.graph.get_attr(name)
    constant.meta["val"] = value
    return constant


def _foldable(node):
    target = node.target
    if target is operator.getitem:
        return True
    return (isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in target.tags)


def fold_constants(gm):
    """Run every op whose tensor inputs are all constants now, and read its result as a constant.
    An op whose result is larger than its inputs together (a broadcast made real) is left to run
    per call: folding it would hold that memory for the graph's life."""
    # the frozen inputs only: other module tensors of the graph (get_attr in graphs from
    # torch.fx.symbolic_trace) may be written by the graph itself
    values = {n: _attr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr" and n.target.startswith(FROZEN)}
    for node in gm.graph.nodes:
        inputs = node.all_input_nodes
        if node.op != "call_function" or not inputs or not all(i in values for i in inputs) or not _foldable(node):
            continue
        args, kwargs = map_arg((node.args, node.kwargs), lambda n: values[n])
        out = node.target(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.numel() > sum(_numel(values[i]) for i in inputs):
            continue
        values[node] = out
    changed = False
    for node, value in values.items():
        if node.op == "get_attr" or not isinstance(value, torch.Tensor) or all(u in values for u in node.users):
            continue
        node.replace_all_uses_with(_new_constant(gm, node, value))
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed


def _numel(value):
    return value.numel() if isinstance(value, torch.Tensor) else 0


# ---- per-channel arithmetic after a convolution --------------------------------------------------

_BINARY = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)


def fold_into_convolutions(gm):
    """conv(x, W, b) followed by `* c`, `/ c`, `+ c` or `- c`, c a constant per output channel (or a
    scalar), as one conv(x, W', b'): eval batch norm after a convolution, once its statistics are
    folded. Repeats until nothing changes; returns whether anything did."""
    changed_any = False
    while True:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target is aten.convolution.default and _fold_user(gm, node):
                changed = changed_any = True
        if not changed:
            break
    if changed_any:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed_any


def _fold_user(gm, conv):
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
    if transposed or len(conv.users) != 1 or not is_frozen(weight) or (bias is not None and not is_frozen(bias)):
        return False
    user = next(iter(conv.users))
    if user.target not in _BINARY or user.kwargs.get("alpha", 1) != 1 or user.args[0] is not conv and (
            user.target in (aten.sub.Tensor, aten.div.Tensor)):
        return False
    other = user.args[1] if user.args[0] is conv else user.args[0]
    w = _attr(gm, weight.target)
    out_meta, conv_meta = user.meta.get("val"), conv.meta.get("val")
    if not isinstance(conv_meta, torch.Tensor) or not isinstance(out_meta, torch.Tensor) or \
            out_meta.dtype != conv_meta.dtype or out_meta.shape != conv_meta.shape:
        return False
    channels = w.shape[0]
    c = _per_channel(gm, other, channels, conv_meta.dim())
    if c is None:
        return False
    b = _attr(gm, bias.target) if bias is not None else torch.zeros(channels, dtype=w.dtype)
    scale = (1,) * (w.dim() - 1)
    if user.target is aten.mul.Tensor:
        w, b = w * c.view(channels, *scale), b * c
    elif user.target is aten.div.Tensor:
        w, b = w / c.view(channels, *scale), b / c
    else:
        b = b + c if user.target is aten.add.Tensor else b - c
    with gm.graph.inserting_before(user):
        new_weight = _new_constant(gm, user, w.to(_attr(gm, weight.target).dtype), FROZEN + "_conv_weight")
        new_bias = _new_constant(gm, user, b.to(w.dtype), FROZEN + "_conv_bias")
        folded = gm.graph.call_function(aten.convolution.default, (x, new_weight, new_bias, stride, padding, dilation,
                                                                    transposed, output_padding, groups))
    folded.meta.update(conv.meta)
    folded.meta["val"] = out_meta
    user.replace_all_uses_with(folded)
    gm.graph.erase_node(user)
    gm.graph.erase_node(conv)
    return True


def _per_channel(gm, other, channels, ndim):
    """`other` as a vector of `channels` values when it is a constant that varies along the channel
    dim of an (N, C, ...) result only (or a Python number), else None."""
    if isinstance(other, (int, float)) and not isinstance(other, bool):
        return torch.full((channels,), float(other))
    if not is_frozen(other):
        return None
    c = _attr(gm, other.target)
    if not isinstance(c, torch.Tensor) or not c.is_floating_point() or c.dim() > ndim:
        return None
    shape = (1,) * (ndim - c.dim()) + tuple(c.shape)
    if any(s != 1 for d, s in enumerate(shape) if d != 1) or shape[1] not in (1, channels):
        return None
    return c.reshape(-1).expand(channels).clone()


def channels_last_weights(gm):
    """The constant weights of 2-d convolutions laid out channels-last once, now (layout_opt runs every
    convolution of a frozen graph in channels-last memory)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        weight = node.args[1]
        if not is_frozen(weight):
            continue
        w = _attr(gm, weight.target)
        if w.dim() == 4 and not w.is_contiguous(memory_format=torch.channels_last):
            node.update_arg(1, _new_constant(gm, node, w.contiguous(memory_format=torch.channels_last),
                                             FROZEN + "_conv_weight"))
    gm.graph.eliminate_dead_code()
    gm.recompile()
