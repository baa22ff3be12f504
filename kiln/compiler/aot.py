"""The aot step: a torch-level fx graph -> a functional, decomposed aten graph, and the runtime glue
that gives the compiled graph eager's side effects back.

`trace_aten` runs the graph with `make_fx` on fake tensors under `torch.func.functionalize`:
every in-place op becomes its functional twin, and a mutated input becomes an extra graph output
(its new value). Views stay view ops (remove="mutations", not "mutations_and_views"): with no
mutation left they are safe, lowering treats them as index maps, and their fake values keep
eager's strides, which the alias analysis below and output layouts rely on.

`make_runner` wraps the compiled flat callable: it copies those new values into the inputs (as
eager would have mutated them) and rebuilds the user's output structure.

Parameters and buffers the graph reads through `get_attr`/`call_module` (graphs from
`torch.fx.symbolic_trace`) are traced as inputs, so mutating one (BatchNorm running stats) is
written back like an input; in the aten graph they are `get_attr` nodes on the same tensors.

Aliasing: eager returns some outputs as views of inputs (`x.t()`, `x.add_(1)` returns `x`). The
functional graph computes their values; the runner then rebuilds each such output from its input
(the input itself, or `as_strided` with eager's size/stride/offset) so it shares storage as in
eager. An output that is a view of another output is rebuilt from it (`OutputView`), so a later
in-place op on one shows in the other. Two views of an intermediate that is not itself an output,
and views that change the dtype (`view_as_complex`), come back as separate tensors: equal values,
no shared storage.
"""
import contextlib
import math
import operator

import torch
import torch.utils._pytree as pytree
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_symbols
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           FakeTensor)

from kiln.compiler.decompositions import lowering_decompositions
from kiln.torch_compat import dispatcher_for, draws_random
from kiln.compiler.runner import AtenGraph, OutputAlias, OutputView, make_runner  # noqa: F401 (make_runner: aot's API)
from kiln.debug import logs
from kiln.exc import KilnError

__all__ = ["AtenGraph", "OutputAlias", "AotUnsupported", "trace_aten", "lowering_decompositions",
           "make_runner"]


class AotUnsupported(KilnError):
    """A graph the aot step cannot trace, or cannot make functional without changing its meaning:
    one whose trace depends on tensor values (`.item()` feeding Python, `torch.equal`, output
    sizes like nonzero's that force a guard), a sparse input, an input whose shape is mutated,
    a mutated input that shares memory with another input. The caller can run such a graph
    eagerly."""


# What fake tensors raise when tracing needs a tensor's values.
DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)
# ... and what a C++ kernel raises when it reads a fake tensor's data (tensor_split by a tensor).
FAKE_DATA_READ = "data is not allocated yet"
# ... and what functionalization asserts on a mutation it cannot express (zero_ on an expanded view
# of an intermediate, which eager accepts): such graphs run eagerly
FUNCTIONALIZE_REFUSED = ("DispatchKey::Functionalize",
                         # a write into a tensor whose elements share memory (eager's fill_ accepts it)
                         "more than one element of the written-to tensor refers to a single memory location")


def trace_aten(gm, example_inputs, decompositions=None) -> AtenGraph:
    """Trace the torch-level `gm` on `example_inputs` into a functional aten graph."""
    if decompositions is None:
        decompositions = lowering_decompositions()
    example_inputs = list(example_inputs)
    _check_strided(example_inputs)
    trace_inputs = _symbolic_example_values(gm) or example_inputs
    state_names, state = _module_tensors(gm)
    run, out_specs = _flat_function(gm, len(example_inputs), state_names)
    try:
        traced = _functional_trace(run, decompositions, trace_inputs, state)
    except (*DATA_DEPENDENT, RuntimeError) as e:
        if any(refusal in str(e) for refusal in FUNCTIONALIZE_REFUSED):
            raise AotUnsupported(f"functionalization refused the graph ({str(e).splitlines()[0]})") from e
        if not isinstance(e, DATA_DEPENDENT) and FAKE_DATA_READ not in str(e):
            raise
        raise AotUnsupported(f"the graph depends on tensor values while tracing "
                             f"({type(e).__name__}: {str(e).splitlines()[0]})") from e
    if _mutates_intermediates(traced.graph):
        # Decompositions run below functionalization, so one that uses in-place ops (isclose,
        # rms_norm, diff, ...) leaves them in the graph; a second functional pass removes them.
        traced = _functional_trace(traced, decompositions, trace_inputs, state)

    graph = traced.graph
    placeholders = graph.find_nodes(op="placeholder")
    writes = _take_write_backs(graph, placeholders)
    _check_functional(graph)
    user_outputs = list(graph.output_node().args[0])
    n = len(example_inputs)
    mutated_inputs = sorted(i for i in writes if i < n)
    mutated_state = sorted(i for i in writes if i >= n)
    _check_mutated_inputs_do_not_overlap(example_inputs, mutated_inputs)
    aliases = _output_aliases(user_outputs, placeholders[:n], writes)
    views = _output_views(user_outputs, {a.output_index for a in aliases})
    graph.output_node().args = (tuple(user_outputs + [writes[i] for i in mutated_inputs + mutated_state]),)
    _state_to_attributes(traced, placeholders[n:], state_names, state)
    graph.eliminate_dead_code()
    graph.lint()
    traced.recompile()

    aten = AtenGraph(gm=traced, num_user_outputs=len(user_outputs), mutated_inputs=mutated_inputs,
                     out_spec=out_specs[-1], mutated_attrs=[state[i - n] for i in mutated_state],
                     output_aliases=aliases, output_views=views)
    if logs.enabled("aot"):
        logs.log("aot", "aten graph: %d inputs, %d user outputs, mutated inputs %s, %d mutated "
                 "module tensors, aliased outputs %s\n%s", n, aten.num_user_outputs, mutated_inputs,
                 len(mutated_state), [(a.output_index, a.input_index) for a in aliases],
                 traced.print_readable(print_output=False))
    return aten


def _symbolic_example_values(gm):
    """The placeholders' fake example values, when capture made some sizes symbolic (dynamic
    shapes): tracing those, not the real inputs, keeps the graph valid for every size capture
    will call it with. None when all sizes are static."""
    values = [node.meta.get("example_value") for node in gm.graph.find_nodes(op="placeholder")]
    symbolic = any(is_symbolic(v) for v in values)
    if not symbolic or any(v is None for v in values):
        return None
    # detached: functionalization writes mutated inputs back, which a leaf requiring grad refuses
    return [v.detach() if isinstance(v, torch.Tensor) else v for v in values]


def is_symbolic(value):
    """A symbolic number input (an int or float capture made symbolic), or a fake tensor with
    symbolic sizes: tracing must use it, not the real value, to serve every value."""
    return isinstance(value, (torch.SymInt, torch.SymFloat)) or (isinstance(value, FakeTensor) and _has_symbols(value))


def _has_symbols(t):
    return any(free_symbols(s) for s in (*t.shape, *t.stride()))


def _check_strided(example_inputs):
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.layout is not torch.strided:
            raise AotUnsupported(f"input {i} is a {x.layout} tensor; kiln compiles strided tensors only")


def _functional_trace(fn, decompositions, example_inputs, state):
    mode = tracing_mode(example_inputs)
    if mode == "symbolic" and not isinstance(fn, torch.fx.GraphModule):
        # Under torch.func.functionalize, CompositeImplicit ops run their C++ bodies on
        # functional wrappers, and some read concrete sizes there (linear on a 3-d input calls
        # aten.size): that pins a symbolic size, and the graph recompiles for every size. So trace
        # to aten first (mutations kept; decompositions see SymInts), then functionalize that
        # aten graph, which holds no composite ops any more.
        with fx_traceback.preserve_node_meta():
            fn = make_fx(fn, decomposition_table=decompositions, tracing_mode=mode)(*example_inputs, *state)
        if not _has_mutations(fn.graph):  # already functional: a second trace would change nothing
            return fn
    if isinstance(fn, torch.fx.GraphModule):  # node by node, so each aten node keeps its user line
        fn = meta_keeping(fn)
    with fx_traceback.preserve_node_meta():
        return make_fx(torch.func.functionalize(fn, remove="mutations"), decomposition_table=decompositions,
                       tracing_mode=mode)(*example_inputs, *state)


def meta_keeping(gm):
    """`gm` run by torch.fx.Interpreter: under fx_traceback.preserve_node_meta, each node traced
    through it hands its meta (the user's stack_trace and op, set by capture) to the aten nodes it
    becomes; gm's generated forward would not."""
    return lambda *args: _MetaKeepingInterpreter(gm).run(*args)


class _MetaKeepingInterpreter(torch.fx.Interpreter):
    # each op dispatches as its fake run in capture did (torch_compat.dispatcher_for): a C++
    # composite that reads concrete sizes (addcmul of broadcast operands) fails on symbolic ones.
    # A random op keeps eager's C++ kernel: a Python decomposition (dropout's) draws other numbers
    def call_function(self, target, args, kwargs):
        with _dispatcher(target, args, kwargs):
            return super().call_function(target, args, kwargs)

    def call_method(self, target, args, kwargs):
        with _dispatcher(target, args, kwargs):
            return super().call_method(target, args, kwargs)

    def output(self, target, args, kwargs):
        # the structure the generated forward returns: plain lists and dicts, not fx's immutable ones
        return _mutable(args[0])


def _dispatcher(target, args, kwargs):
    return contextlib.nullcontext() if draws_random(target) else dispatcher_for(target, args, kwargs)


def _mutable(value):
    if isinstance(value, list):
        return [_mutable(v) for v in value]
    if isinstance(value, dict):
        return {k: _mutable(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(_mutable(v) for v in value)
    return value


class MetaKeepingModule(torch.nn.Module):
    """A module whose call runs `gm` through meta_keeping (torch.func.functional_call needs a module)."""

    def __init__(self, gm):
        super().__init__()
        self.gm = gm

    def forward(self, *args):
        return meta_keeping(self.gm)(*args)


def _has_mutations(graph):
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in graph.nodes)


def _mutates_intermediates(graph):
    """Whether a mutating op other than the final write-back of an input is in the graph."""
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               and not (n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder")
               for n in graph.nodes)


def _module_tensors(gm):
    """The parameters and buffers `gm` uses, by qualified name (traced as extra inputs)."""
    named = dict(gm.named_parameters())
    named.update(gm.named_buffers())
    return list(named), list(named.values())


def _flat_function(gm, num_inputs, state_names):
    """A function of (inputs..., module tensors...) that runs `gm` and returns its flat outputs;
    the output TreeSpec is appended to the returned list when it runs."""
    out_specs = []

    def run(*flat):
        inputs = flat[:num_inputs]
        before = [_shape(x) for x in inputs]
        with _RefuseOverlappingWrites():
            if state_names:
                out = torch.func.functional_call(MetaKeepingModule(gm), {f"gm.{name}": t for name, t in zip(
                    state_names, flat[num_inputs:])}, tuple(inputs))
            else:
                out = meta_keeping(gm)(*inputs)
        # Only a shape change is refused: the write-back copies values, so an input whose
        # strides change (x.t_() on a square x) still reads as eager's; only its strides differ.
        for i, (x, shape) in enumerate(zip(inputs, before)):
            if _shape(x) != shape:
                raise AotUnsupported(f"the graph changes the shape of input {i} ({shape} -> "
                                     f"{_shape(x)}); kiln cannot compile that")
        leaves, spec = pytree.tree_flatten(out)
        out_specs.append(spec)
        return leaves

    return run, out_specs


_INPLACE_DUNDERS = {f"__i{name}__" for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or",
                                                 "xor", "lshift", "rshift", "matmul")} | {"__setitem__"}


_EXPANDS = ("expand", "expand_as", "broadcast_to", "broadcast_tensors")


class _RefuseOverlappingWrites(TorchFunctionMode):
    """Functionalization writes a mutated view back into its base element by element (an expanded
    view's write-back sums its copies), so a write into a tensor whose elements share memory
    (fill_/zero_ on an expanded view, which eager accepts) cannot be made functional. Nor can a
    write through any expand (even one that adds no copies): its inverse is arithmetic,
    base + (new - base), which turns inf into NaN and -0.0 into 0.0. Such graphs run eagerly."""

    def __init__(self):
        super().__init__()
        self.expanded = {}  # id -> tensor (held, so ids stay unique): expands and their views

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inplace = (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_DUNDERS
        target = kwargs.get("out", args[0] if inplace and args else None)
        if isinstance(target, torch.Tensor) and (may_overlap_itself(target) or id(target) in self.expanded):
            raise AotUnsupported(f"{name} writes into an expanded tensor or one whose elements share memory")
        out = func(*args, **kwargs)
        source = args[0] if args else None
        if name in _EXPANDS or (not inplace and isinstance(source, torch.Tensor) and id(source) in self.expanded):
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and (name in _EXPANDS or torch._C._is_alias_of(t, source)):
                    self.expanded[id(t)] = t
        return out


def _shape(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else None


def tracing_mode(example_inputs):
    """"symbolic" when the inputs carry symbolic sizes (capture's fake example values)."""
    for x in example_inputs:
        if is_symbolic(x):
            return "symbolic"
    return "fake"


def _take_write_backs(graph, placeholders):
    """Remove functionalization's trailing `copy_(input, new_value)` nodes; returns
    {input position: new value node}."""
    position = {p: i for i, p in enumerate(placeholders)}
    writes = {}
    for node in list(graph.nodes):
        if node.target is torch.ops.aten.copy_.default and node.args[0] in position:
            target, value = node.args[0], node.args[1]
            if _val(value).shape != _val(target).shape or _val(value).dtype != _val(target).dtype:
                raise AotUnsupported(f"input {position[target]} is written with a value of another "
                                     "shape or dtype")
            writes[position[target]] = value
            graph.erase_node(node)
    return writes


def _check_functional(graph):
    for node in graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            raise KilnError(f"aot left a mutating op in the graph: {node.format_node()}")


def is_view(node):
    """Whether `node` returns a view of its first argument (a view op, or an item of one)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], torch.fx.Node) and is_view(node.args[0])
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def _output_aliases(user_outputs, input_nodes, writes):
    """Which user outputs eager returns as inputs, or as views of them."""
    owner = {node: i for i, node in enumerate(input_nodes)}
    owner.update((node, i) for i, node in writes.items() if i < len(input_nodes))
    aliases = []
    for k, out in enumerate(user_outputs):
        node, chain = out, []
        while isinstance(node, torch.fx.Node) and node not in owner and is_view(node):
            chain.append(node)
            node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node not in owner:
            continue
        if node is out:
            aliases.append(OutputAlias(k, owner[node], None))
            continue
        val = _val(out)
        if val.dtype != _val(node).dtype:  # view_as_complex, x.view(dtype): values only
            continue
        if node is not input_nodes[owner[node]]:
            # a view of an input's new value: its strides were traced on the functional value's
            # layout, not the input's; eager took the same views of the input itself
            val = _replay_views(chain[::-1], _val(input_nodes[owner[node]]))
            if val is None:
                continue
        layout = (tuple(val.shape), tuple(val.stride()), val.storage_offset())
        if not any(free_symbols(s) for s in (*layout[0], *layout[1], layout[2])):
            aliases.append(OutputAlias(k, owner[node], layout, _constant_ops(chain[::-1])))
    return aliases


def _constant_ops(chain):
    """The view nodes `chain` as ((op, args, kwargs), ...) when every argument after the viewed
    tensor is a constant, else ()."""
    ops = []
    for node in chain:
        rest = (node.args[1:], node.kwargs)
        if any(isinstance(a, (torch.fx.Node, torch.SymInt)) for a in pytree.tree_leaves(rest)):
            return ()
        ops.append((node.target, tuple(node.args[1:]), dict(node.kwargs)))
    return tuple(ops)


def _output_views(user_outputs, aliased):
    """Which user outputs (not aliasing an input) eager returns as views of another user output."""
    position = {}
    for k, node in enumerate(user_outputs):
        if isinstance(node, torch.fx.Node):
            position.setdefault(node, k)
    views = []
    for k, out in enumerate(user_outputs):
        if k in aliased or not isinstance(out, torch.fx.Node):
            continue
        node = out
        while is_view(node):
            node = node.args[0]
            j = position.get(node)
            if j is None or j == k or j in aliased:
                continue
            val, base = _val(out), _val(node)
            layout = (tuple(val.shape), tuple(val.stride()), val.storage_offset())
            base_layout = (tuple(base.stride()), base.storage_offset())
            if val.dtype == base.dtype and not any(free_symbols(s) for s in (*layout[0], *layout[1], layout[2],
                                                                             *base_layout[0], base_layout[1])):
                views.append(OutputView(k, j, layout, base_layout))
            break
    return views


def _replay_views(chain, base):
    """The fake value of the view ops `chain` applied to `base`, or None when one does not apply
    as a view there (a reshape eager would have copied)."""
    if not isinstance(base, FakeTensor):
        return None
    try:
        with base.fake_mode:
            t = base
            for node in chain:
                rest = (node.args[1:], node.kwargs)
                if any(isinstance(a, torch.fx.Node) for a in pytree.tree_leaves(rest)):
                    return None
                t = t[node.args[1]] if node.target is operator.getitem else node.target(t, *rest[0], **rest[1])
    except Exception:  # noqa: BLE001 - any refusal means: not a view of the input there
        return None
    if not isinstance(t, torch.Tensor) or not torch._C._is_alias_of(t, base):
        return None
    return t


def _check_mutated_inputs_do_not_overlap(example_inputs, mutated):
    """Functionalization treats inputs as independent; a mutated input that shares memory with
    another input would leave the other one stale. It also treats an input's elements as
    independent: a mutated input whose elements share memory (an expanded tensor, which eager's
    fill_ accepts) cannot be written back element by element."""
    real = [(i, x) for i, x in enumerate(example_inputs)
            if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor)]
    for i in mutated:
        if not isinstance(example_inputs[i], FakeTensor) and may_overlap_itself(example_inputs[i]):
            raise AotUnsupported(f"input {i} is mutated and some of its elements share memory")
        ptr = example_inputs[i].untyped_storage().data_ptr()
        for j, x in real:
            if j != i and x.untyped_storage().data_ptr() == ptr:
                raise AotUnsupported(f"input {i} is mutated and shares memory with input {j}")


def may_overlap_itself(x):
    """Whether two elements of `x` may share memory (conservative: walks dims by stride). A
    symbolic size or stride counts at its value in the trace (its hint): the guards keep the
    layout's kind (an expanded input stays expanded) on every call the graph serves."""
    shape, strides = [_hint(v) for v in x.shape], [_hint(v) for v in x.stride()]
    if None in shape or None in strides:
        return True  # a size read from data: nothing proves the elements apart
    if math.prod(shape) <= 1:
        return False
    reach = 0  # the furthest offset the smaller-stride dims reach
    for stride, size in sorted((st, s) for s, st in zip(shape, strides) if s != 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _hint(v):
    """An int size or stride; a SymInt's value in the trace (None when it has none)."""
    return v.node.hint if isinstance(v, torch.SymInt) else v


def _state_to_attributes(traced, state_placeholders, names, tensors):
    """Turn the traced module-tensor inputs back into `get_attr` nodes on the same tensors."""
    graph = traced.graph
    for placeholder, name, tensor in zip(state_placeholders, names, tensors):
        attr = "_kiln_" + name.replace(".", "_")
        if isinstance(tensor, torch.nn.Parameter):
            traced.register_parameter(attr, tensor)
        else:
            traced.register_buffer(attr, tensor)
        with graph.inserting_before(placeholder):
            node = graph.get_attr(attr)
        node.meta.update(placeholder.meta)
        placeholder.replace_all_uses_with(node)
        graph.erase_node(placeholder)


def _val(node):
    return node.meta["val"]


