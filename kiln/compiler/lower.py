"""Lower a functional aten graph to kiln's loop IR.

`GraphLowering` walks the aten graph once. Each node is lowered by the function registered for
its op in `LOWERINGS` (see `kiln.compiler.lowering_base`), which returns TensorValues: lazy index
functions that compose, so pointwise chains cost nothing until a value is realized into a
buffer. An op with no lowering (or whose lowering declines with `Fallback`) becomes an
`ExternCall` that the wrapper makes to aten: never an error, named under KILN_LOGS=perf_hints.
"""
import dataclasses
import operator

import sympy
import torch
import torch.utils._pytree as pytree
from torch.utils._sympy.printers import PythonPrinter

from kiln.compiler import ir
from kiln.compiler import lowerings, lowerings_pooling, lowerings_pooling_backward, lowerings_scan, lowerings_scatter
from kiln.compiler.codegen.backend import DeviceBackends
from kiln.compiler.provenance import origin_nodes
from kiln.compiler.lowering_base import LOWERINGS, Fallback, LoweringContext, sym_layout
from kiln.compiler.size_facts import SizeFacts
from kiln.debug.logs import log

# the modules whose lowerings fill LOWERINGS (each registers its own on import)
LOWERING_MODULES = (lowerings, lowerings_pooling, lowerings_pooling_backward, lowerings_scan, lowerings_scatter)
# a lazy value with several users is computed once (realized) when it costs more than this
# (see ir.Expr.cost); cheaper ones are recomputed in each consumer, cheaper than memory traffic
REALIZE_SHARED_COST = 4
# any lazy value this big is realized, to keep kernels (and Python tracing) small
REALIZE_MAX_OPS = 80
# aten ops whose result depends on their tensor argument's strides, not only its values: an extern
# call of one gets each argument with the strides the trace gave it
_READS_STRIDES = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
                            torch.ops.aten._reshape_alias.default, torch.ops.aten.as_strided.default,
                            torch.ops.aten.view.dtype})


def symbol_sources(placeholders):
    """{symbol: Python source that reads it from the graph's inputs (arg0, arg1, ...)}: for each
    free symbol, the first input size, stride, storage offset or SymInt input that is exactly it.
    The wrapper reads only those its code uses."""
    sources = {}

    def offer(value, source):
        expr = ir.size_expr(value)
        if expr.is_Symbol and expr not in sources:
            sources[expr] = source
    for position, node in enumerate(placeholders):
        val, arg = node.meta.get("val"), f"arg{position}"
        if isinstance(val, torch.SymInt):
            offer(val, arg)
        elif isinstance(val, torch.Tensor):
            for d, s in enumerate(val.shape):
                offer(s, f"{arg}.size({d})")
            for d, s in enumerate(val.stride()):
                offer(s, f"{arg}.stride({d})")
            offer(val.storage_offset(), f"{arg}.storage_offset()")
    return sources


class GraphLowering(LoweringContext):
    """The IR of one aten graph: buffers in program order, and which buffers are the outputs."""

    def __init__(self, gm, example_inputs, options, output_metas=None):
        self.gm = gm
        # the fake values whose layouts the outputs get (default: the graph's own; layout_opt
        # passes the original graph's, its copy's having channels-last strides)
        self.output_metas = output_metas
        self.options = options
        self.example_inputs = example_inputs
        self.buffers = []           # ir.Buffer, in program order
        self.buffer_by_name = {}
        self.outputs = []           # per graph output: ("buffer", name, layout) | ("value", python)
        self.fallbacks = []         # names of aten ops that went to aten
        self.env = {}
        # id(lazy value) -> (value, its view): a value realized for one aten call is reused by the
        # next, not computed again (a linear's backward feeds one gradient to two matmuls)
        self.extern_args = {}
        # size symbol -> Python source reading it from the inputs (empty for static graphs); float
        # symbols (not integer) -> Python source computing them from the size symbols
        self.symbol_sources = {}
        self.facts = SizeFacts.of_graph(gm)  # what the guards proved about symbolic sizes
        self.backends = DeviceBackends(options)  # the kernel backend of each device (codegen/backend)
        self.device = ir.CPU  # where the node being lowered computes: its computed buffers live there
        # provenance: buffer name -> the aten nodes it computes (see compiler/provenance)
        self.origins = {}
        self.origin_node = None  # the node whose lowering makes buffers now
        self.node_order = {n: i for i, n in enumerate(gm.graph.nodes)}

    # ---- buffers -------------------------------------------------------------------------
    def new_name(self):
        return f"buf{len(self.buffers)}"

    def add_buffer(self, buf, device=None):
        """Add `buf`; a computed buffer lives on `device` (default: the device of the node being lowered)."""
        if isinstance(buf, ir.ComputedBuffer):
            buf.layout = dataclasses.replace(buf.layout, device=device or self.device)
        self.buffers.append(buf)
        self.buffer_by_name[buf.name] = buf
        self.origins[buf.name] = sorted(origin_nodes(self.origin_node, self.env), key=self.node_order.get)
        return buf

    def realize(self, value, layout=None):
        """A StridedView of `value`: its own if it has one, else a new ComputedBuffer (laid out as
        eager lays the value out, unless `layout` says otherwise)."""
        if value.view is not None and layout is None:
            return value
        layout = layout or ir.Layout(value.sizes, value.strides or ir.contiguous_strides(value.sizes), value.dtype)
        buf = self.add_buffer(ir.ComputedBuffer(self.new_name(), layout, ir.Pointwise(value.sizes, value.loader)),
                              value.device)
        return ir.view_value(buf.name, buf.layout)

    def reduction(self, sizes, reduction_sizes, reduction_type, inner_fn, dtype):
        """Realize a reduction into a contiguous buffer of `sizes`; returns its value."""
        layout = ir.Layout(tuple(sizes), ir.contiguous_strides(sizes), dtype)
        buf = self.add_buffer(ir.ComputedBuffer(
            self.new_name(), layout, ir.Reduction(tuple(sizes), tuple(reduction_sizes), reduction_type, inner_fn)))
        return ir.view_value(buf.name, buf.layout)

    # ---- the walk ------------------------------------------------------------------------
    def run(self):
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.symbol_sources = symbol_sources(placeholders)
        for position, (node, example) in enumerate(zip(placeholders, self.example_inputs)):
            if self.symbol_sources:  # dynamic shapes: the traced (symbolic) value, not this call's
                example = node.meta.get("val", example)
                if isinstance(example, torch.SymInt):
                    example = ir.size_expr(example)
            if isinstance(example, torch.Tensor):
                buf = self.add_buffer(ir.InputBuffer(f"arg{position}", sym_layout(example), position))
                self.env[node] = ir.view_value(buf.name, buf.layout)
            else:
                self.env[node] = example
        for node in self.gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(self.gm, node.target)
                if value.layout != torch.strided:  # a prepacked weight (onednn_fusion): only aten reads it
                    self.env[node] = value
                    continue
                buf = self.add_buffer(ir.ConstantBuffer(f"const{len(self.buffers)}", sym_layout(value), value))
                self.env[node] = ir.view_value(buf.name, buf.layout)
            elif node.op == "call_function":
                self.device = node_device(node)
                self.origin_node = node
                value = with_eager_strides(self.lower_node(node), node.meta.get("val"))
                if isinstance(value, ir.TensorValue) and value.view is None and value.device != self.device:
                    value = dataclasses.replace(value, device=self.device)
                self.env[node] = value
                self.maybe_realize_shared(node)
            elif node.op == "output":
                self.lower_outputs(node)
        return self

    def lower_node(self, node):
        if node.target is operator.getitem:
            return self.env[node.args[0]][node.args[1]]
        if isinstance(node.meta.get("val"), torch.SymInt):
            # a size computed from sizes (sym_size, s0 * 2, ...): its expression over the symbols
            return ir.size_expr(node.meta["val"])
        if isinstance(node.meta.get("val"), torch.SymFloat):
            return self.float_symbol(node.meta["val"])
        args, kwargs = pytree.tree_map(self.lookup, (node.args, node.kwargs))
        lowering = LOWERINGS.get(node.target)
        reason = "no kiln lowering" if lowering is None else self.fallback_reason(node)
        if reason is None:
            self.current_node = node
            try:
                return lowering(self, *args, **kwargs)
            except Fallback as why:
                reason = f"lowering declined: {why}"
            except Exception as bug:  # a lowering bug must not cost the user a compile
                if self.options.get("debug"):
                    raise
                reason = f"lowering raised {type(bug).__name__}: {bug}"
        return self.extern(node, args, kwargs, reason)

    def fallback_reason(self, node):
        """Why `node` must run through aten even though it has a lowering, or None."""
        if isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags:
            return "random op: aten draws the numbers, as eager does"
        values = [a.meta.get("val") for a in node.all_input_nodes] + pytree.tree_leaves(node.meta.get("val"))
        tensors = [t for t in values if isinstance(t, torch.Tensor)]
        if any(t.dtype not in ir.KERNEL_DTYPES for t in tensors):
            return "a dtype kernels have no C++ type for"
        # the device seam: a kernel touches the memory of one device, through that device's backend
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            return f"tensors on several devices ({', '.join(sorted(map(str, devices)))})"
        if devices and self.backends.for_device(self.device) is None:
            return f"a tensor on device {self.device}, which kiln has no kernel backend for here"
        return None

    def float_symbol(self, value):
        """A float computed from sizes (1.0 / x.size(1)): a symbol the wrapper computes in Python,
        as eager does, and passes to kernels as a double."""
        sym = sympy.Symbol(f"kf{len(self.symbol_sources)}", real=True)
        self.symbol_sources[sym] = PythonPrinter().doprint(value.node.expr)
        return sym

    def lookup(self, a):
        return self.env[a] if isinstance(a, torch.fx.Node) else a

    def out_meta(self):
        """The fake tensor(s) the current node produced at trace time."""
        return self.current_node.meta["val"]

    def maybe_realize_shared(self, node):
        value = self.env[node]
        if not isinstance(value, ir.TensorValue) or value.view is not None:
            return
        expr = value.loader(tuple(sympy.Symbol(f"i{k}", integer=True, nonnegative=True) for k in range(value.ndim)))
        if expr.op_count() > REALIZE_MAX_OPS or (len(node.users) > 1 and expr.cost() > REALIZE_SHARED_COST):
            self.env[node] = self.realize(value)

    # ---- externs -------------------------------------------------------------------------
    def realize_for_extern(self, value):
        """`realize(value)`, once per lazy value: every aten call that reads it reads one buffer."""
        if value.view is not None:
            return value
        seen = self.extern_args.get(id(value))
        if seen is not None and seen[0] is value:
            return seen[1]
        realized = self.realize(value)
        self.extern_args[id(value)] = (value, realized)
        return realized

    def extern(self, node, args, kwargs, reason):
        """Call aten for `node`; tensor arguments are realized, results become ExternBuffers."""
        log("perf_hints", "%s runs through aten (%s)", node.target, reason)
        if self.symbol_sources:
            log("dynamic", "%s runs through aten in a graph with symbolic sizes (%s)", node.target, reason)
        self.fallbacks.append(str(node.target))

        def as_arg(a):
            if isinstance(a, ir.TensorValue):
                # the buffer computes the argument's lazy value (on its own device, a.device): its
                # origins are that value's node's
                saved = self.origin_node
                self.origin_node = source = next((n for n in node.all_input_nodes if self.env.get(n) is a), node)
                view = self.realize_for_extern(a).view
                if node.target in _READS_STRIDES and source is not node and \
                        isinstance(traced := source.meta.get("val"), torch.Tensor) and \
                        view.layout.strides != sym_layout(traced).strides:
                    # a value kiln kept as another tensor's view (a clone is the value itself): an op
                    # whose result depends on its argument's strides gets the strides eager gave it
                    view = self.realize(a, sym_layout(traced)).view
                self.origin_node = saved
                own = self.buffer_by_name[view.name].layout
                return ir.BufferArg(view.name, None if view.layout == own else view.layout)
            return a

        call_args, call_kwargs = pytree.tree_map(as_arg, (args, kwargs),
                                                 is_leaf=lambda a: isinstance(a, ir.TensorValue))
        name = f"extern{len(self.buffers)}"
        call = ir.ExternCall(name, node.target, call_args, call_kwargs, None)

        def as_output(meta):
            if not isinstance(meta, torch.Tensor):
                return None
            buf = self.add_buffer(ir.ExternBuffer(self.new_name(), sym_layout(meta), call))
            return buf.name

        call.outputs = pytree.tree_map(as_output, node.meta.get("val"))  # no "val": returns None
        if call.outputs is None or not pytree.tree_leaves(call.outputs):
            # no tensor results (or only None): still run it (it may have effects), keep a marker
            self.add_buffer(ir.ExternBuffer(name, ir.Layout((), (), torch.float32), call))
        return pytree.tree_map(lambda b: None if b is None else ir.view_value(b, self.buffer_by_name[b].layout),
                               call.outputs)

    # ---- outputs -------------------------------------------------------------------------
    def lower_outputs(self, node):
        for position, out in enumerate(node.args[0]):
            self.origin_node = out
            value = self.lookup(out)
            if not isinstance(value, ir.TensorValue):
                self.outputs.append(("value", value))
                continue
            meta = out.meta["val"] if self.output_metas is None else self.output_metas[position]
            layout = sym_layout(meta)
            self.device = meta.device
            if value.view is not None and isinstance(self.buffer_by_name[value.view.name],
                                                     (ir.InputBuffer, ir.ConstantBuffer)) and not _is_input_alias(out):
                # an input's elements (floor of ints, clone: identity lowerings) that eager returns
                # as a fresh tensor: a copy, or a later write to the input would change it
                self.outputs.append(("buffer", self.realize(value, layout).view.name, None))
            elif value.view is not None and value.view.layout == layout == self.buffer_by_name[value.view.name].layout:
                self.outputs.append(("buffer", value.view.name, None))
            elif value.view is not None and isinstance(self.buffer_by_name[value.view.name], (
                    ir.InputBuffer, ir.ExternBuffer, ir.ConstantBuffer)) and value.view.layout.strides == layout.strides:
                # a view of an input or aten result with the strides eager gave the output: the view
                # itself. Other strides (a contiguous clone kiln kept as a permuted view of an aten
                # result) are copied into eager's layout: a training graph's backward reads a saved
                # value by the strides traced for it (attention's saved q was read transposed under
                # dynamic sizes: wrong gradients)
                self.outputs.append(("buffer", value.view.name, value.view.layout))
            else:
                self.outputs.append(("buffer", self.realize(value, layout).view.name, None))


def node_device(node):
    """The device a node computes on: its (first) tensor result's, else its first tensor input's."""
    values = pytree.tree_leaves(node.meta.get("val")) + [a.meta.get("val") for a in node.all_input_nodes]
    return next((t.device for t in values if isinstance(t, torch.Tensor)), ir.CPU)


def with_eager_strides(value, meta):
    """`value`, remembering the strides of its fake tensor `meta` when they are static, dense and
    not contiguous (and forgetting an input's when they are not): a lazy value is then realized as
    eager lays it out."""
    if not isinstance(value, ir.TensorValue) or value.view is not None or not isinstance(meta, torch.Tensor):
        return value
    layout = sym_layout(meta)
    strides = layout.strides
    if (len(layout.sizes) != len(value.sizes) or any(ir.is_symbolic(e) for e in layout.sizes + layout.strides)
            or strides == ir.contiguous_strides(layout.sizes) or not ir.is_dense(layout)):
        strides = None
    return value if strides == value.strides else dataclasses.replace(value, strides=strides)


def _is_input_alias(node):
    """Whether eager's value of `node` is a graph input (or module tensor) or a view of one."""
    from kiln.compiler.aot import is_view  # the alias rule the aot step rebuilds outputs by
    while isinstance(node, torch.fx.Node):
        if node.op in ("placeholder", "get_attr"):
            return True
        if not is_view(node):
            return False
        node = node.args[0]
    return False

