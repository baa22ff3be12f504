"""Split a joint forward+backward aten graph into a forward graph and a backward graph.

The joint graph takes `(*primals, *tangents)` and returns `(*forward_outputs, *gradients)`.
The forward graph takes the primals and returns `(*forward_outputs, *saved)`; the backward
graph takes `(*saved, *tangents)` and returns the gradients. What is saved is the partitioner's
choice:

- `recompute=False` saves every forward value the backward reads ("save what you use").
- `recompute=True` (default) picks the set of saved values of least total size by a minimum
  cut; values that cut leaves out are recomputed in the backward. Only cheap ops (pointwise,
  views) may be recomputed: never matmuls, reductions or random ops (a random op recomputed
  would draw a different mask than the forward used). Nor a value that a backward op which
  cannot fuse its producer (a matmul, say) reads: the backward would write it to memory again,
  where the forward has already written it, so recomputing costs a full pass (often with
  transcendentals: GELU's output for the weight gradient) and saving costs only its bytes.
"""
import collections
import dataclasses
import math
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from kiln.torch_compat import optimization_hint

aten = torch.ops.aten

# Views and small ops that cost nothing to redo; pointwise ops are found by their tag.
_CHEAP_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default,
    aten.permute.default, aten.transpose.int, aten.expand.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.slice.Tensor,
    aten.select.int, aten.alias.default, aten.detach.default, aten.as_strided.default,
    aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
}


@dataclasses.dataclass
class Partition:
    """The two graphs, and what passes from one to the other."""
    forward: fx.GraphModule      # primals -> (*forward_outputs, *saved)
    backward: fx.GraphModule     # (*saved, *tangents) -> gradients (None where no gradient)
    num_saved: int
    saved_bytes: int             # memory the saved values keep alive: inputs, and views of
                                 # them, count nothing (the caller holds them anyway)


def partition(joint, num_primals, num_forward_outputs, *, recompute=True, unsaveable=()):
    """Partition `joint` (see module doc). `unsaveable`: indices of primals the backward must not
    read as they are (inputs the forward mutates: by backward time they hold the new value)."""
    _shield_unsaveable_primals(joint, num_primals, set(unsaveable))
    j = _JointView(joint, num_primals, num_forward_outputs, unsaveable)
    saved = _min_cut_saved(j) if recompute else _used_forward_values(j)
    saved = sorted(_read_by_backward(j, saved), key=j.order.__getitem__)
    saved += _unreadable_size_symbols(j, saved)
    forward = _forward_graph(j, saved)
    backward = _backward_graph(j, saved)
    return Partition(forward, backward, len(saved), sum(_save_cost(j, n) for n in saved))


class _JointView:
    """The joint graph's nodes sorted by role."""

    def __init__(self, joint, num_primals, num_forward_outputs, unsaveable):
        self.module, self.graph = joint, joint.graph
        placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
        self.primals, self.tangents = placeholders[:num_primals], placeholders[num_primals:]
        self.unsaveable = {self.primals[i] for i in unsaveable}
        self.input_memory = _views_of(set(self.primals) - self.unsaveable)
        outputs = joint.graph.output_node().args[0]
        self.forward_outputs = list(outputs[:num_forward_outputs])
        self.gradients = list(outputs[num_forward_outputs:])
        self.order = {n: i for i, n in enumerate(joint.graph.nodes)}
        self.after_tangents = _descendants(self.tangents)   # the backward proper
        self.backward_needs = _ancestors(g for g in self.gradients if isinstance(g, fx.Node))


def _shield_unsaveable_primals(joint, num_primals, unsaveable):
    """Backward nodes that read a mutated primal directly get a forward clone of it instead."""
    if not unsaveable:
        return
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    after_tangents = _descendants(placeholders[num_primals:])
    for i in sorted(unsaveable):
        primal = placeholders[i]
        readers = [u for u in primal.users if u in after_tangents]
        if readers:
            with joint.graph.inserting_after(primal):
                copy = joint.graph.call_function(aten.clone.default, (primal,))
            copy.meta["val"] = primal.meta.get("val")
            for r in readers:
                r.replace_input_with(primal, copy)
    joint.recompile()


def _used_forward_values(j):
    """Forward values (anything not computed from tangents) that a backward node reads."""
    read = {arg for n in j.after_tangents & j.backward_needs
            for arg in n.all_input_nodes if arg not in j.after_tangents}
    return read | set(_forward_gradients(j))


def _forward_gradients(j):
    """Gradients that do not depend on a tangent (a constant zero, say): computed in forward."""
    return [g for g in j.gradients if isinstance(g, fx.Node) and g not in j.after_tangents]


def _read_by_backward(j, saved):
    """The saved values the backward reads: a cut may also pass inputs of saved values (free
    to save, so the cut is no dearer with them), which would only cost a saved-tensor slot."""
    gradients = [g for g in j.gradients if isinstance(g, fx.Node)]
    return set(saved) & _ancestors(gradients, stop=set(saved))


def _unreadable_size_symbols(j, saved):
    """Forward values to save as well: the plain size symbols (s0) that the backward's values are
    sized by but that no input of it holds as they are. Its compile reads each symbol from an
    input's size, stride or SymInt value, so a backward whose only input is a tangent of size
    (s0 + 1) // 2 (the gradient of x.chunk(2)[0]: the input x is not needed) cannot read s0 and
    is not compiled. Each is read in the forward from the primal that holds it (aten.sym_size)."""
    backward = _ancestors((g for g in j.gradients if isinstance(g, fx.Node)), stop=set(saved))
    needed = set().union(*(_size_exprs(n) for n in backward | set(j.tangents)))
    needed = {s for e in needed for s in e.free_symbols}
    missing = needed - {e for n in [*saved, *j.tangents] for e in _size_exprs(n) if e.is_Symbol}
    if not missing:
        return []
    extra = {}
    for n in j.graph.nodes:  # a forward node that is the symbol already (a sym_size, a SymInt input)
        val = n.meta.get("val")
        if n not in j.after_tangents and isinstance(val, torch.SymInt) and val.node.expr in missing:
            extra.setdefault(val.node.expr, n)
    for primal in j.primals:
        for expr, read in _size_readers(primal):
            if expr in missing and expr not in extra:
                extra[expr] = _insert_after_placeholders(j.graph, read, primal)
    return list(extra.values())


def _size_exprs(node):
    """The sympy expressions of a node's symbolic sizes, strides, storage offset or SymInt value."""
    exprs = []
    for v in pytree.tree_leaves(node.meta.get("val")):
        if isinstance(v, torch.Tensor):
            exprs += [s.node.expr for s in (*v.shape, *v.stride(), v.storage_offset()) if isinstance(s, torch.SymInt)]
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            exprs.append(v.node.expr)
    return exprs


def _size_readers(primal):
    """(expression, (op, args)) for each symbolic size, stride and the storage offset of a primal."""
    val = primal.meta.get("val")
    if isinstance(val, torch.SymInt):
        return []  # a SymInt input is a node itself (found among the forward nodes)
    if not isinstance(val, torch.Tensor):
        return []
    readers = [(s, (aten.sym_size.int, (primal, d))) for d, s in enumerate(val.shape)]
    readers += [(s, (aten.sym_stride.int, (primal, d))) for d, s in enumerate(val.stride())]
    readers.append((val.storage_offset(), (aten.sym_storage_offset.default, (primal,))))
    return [(s.node.expr, read) for s, read in readers if isinstance(s, torch.SymInt)]


def _insert_after_placeholders(graph, read, primal):
    op, args = read
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    with graph.inserting_after(last):
        node = graph.call_function(op, args)
    node.meta["val"] = op(primal.meta["val"], *args[1:])
    return node


def _min_cut_saved(j):
    """The cheapest set of values to save, given which ops the backward may recompute.

    Flow network: each value v is an edge v_in -> v_out whose capacity is v's size (the cost
    of saving it). A value the backward may not recompute hangs from the source; backward
    nodes hang into the sink. A finite cut separates the two, and the values whose edges it
    cuts are exactly what the backward needs saved."""
    materialized = _materialized_in_backward(j)
    flow = _FlowNetwork()
    for n in j.graph.nodes:
        if n not in j.backward_needs or n.op == "output":
            continue
        if n in j.after_tangents:
            if n.op != "placeholder":
                flow.add(("in", n), "sink", math.inf)
            continue
        if n.op == "placeholder" or not _recomputable(n) or n in materialized:
            flow.add("source", ("in", n), math.inf)
        flow.add(("in", n), ("out", n), math.inf if n in j.unsaveable else _save_cost(j, n))
        for user in n.users:
            if user in j.backward_needs and user.op != "output":
                flow.add(("out", n), ("in", user), math.inf)
    for g in _forward_gradients(j):
        flow.add(("out", g), "sink", math.inf)
    reachable = flow.min_cut_source_side()
    return {key[1] for key in reachable
            if isinstance(key, tuple) and key[0] == "in" and ("out", key[1]) not in reachable}


def _recomputable(node):
    if node.op != "call_function":
        return False
    if node.target is operator.getitem or _is_size_arithmetic(node):
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    return node.target in _CHEAP_OPS or torch.Tag.pointwise in node.target.tags


def _is_size_arithmetic(node):
    """Python arithmetic on symbolic sizes (`s0 + s1`): the backward recomputes it from the sizes
    themselves, so what is saved is plain symbols, which its compile reads as such (it cannot
    read s1 out of a saved `s0 + s1`)."""
    return not isinstance(node.target, torch._ops.OpOverload) and \
        isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)) and \
        getattr(node.target, "__module__", None) in ("_operator", "operator", "math", "torch")


def _materialized_in_backward(j):
    """Forward values a backward op reads whole, from memory, rather than fusing their
    computation into its own loop (matmuls, convolutions, ...): recomputing one is never free."""
    readers = (n for n in j.after_tangents & j.backward_needs if not _fuses_inputs(n))
    return {_view_base(arg) for n in readers for arg in n.all_input_nodes
            if arg not in j.after_tangents}


def _view_base(node):
    """The value whose memory `node` is a view of (itself if it is no view): a view is free to
    recompute from it, and generated code returns a view output as a copy."""
    while _returns_view(node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _fuses_inputs(node):
    """Whether generated code computes `node` in a loop that can compute its inputs inline."""
    if node.op != "call_function" or node.target is operator.getitem:
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    tags = node.target.tags
    return (torch.Tag.pointwise in tags or torch.Tag.reduction in tags or node.target in _CHEAP_OPS
            or _returns_view(node))


def _save_cost(j, node):
    """Bytes that saving `node` keeps alive. Inputs and their views are free: the caller holds
    them. A tuple (a multi-output op) cannot be saved whole."""
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):  # first: split_with_sizes of an input is a view, yet a list
        return math.inf
    if node in j.input_memory:
        return 0
    if _returns_view(node) and isinstance(node.args[0], fx.Node) and node.args[0] not in j.unsaveable:
        return _save_cost(j, node.args[0]) + 1  # it keeps its base alive: save the base instead
    if isinstance(val, torch.Tensor):  # with symbolic sizes: their hints, without adding guards
        return optimization_hint(val.numel(), fallback=4096) * val.element_size()
    return 1  # a symbolic scalar: small but not free, so the cut prefers not to pass them


def _views_of(nodes):
    """`nodes` and the values that are views of them (share their memory), transitively."""
    views, stack = set(nodes), list(nodes)
    while stack:
        base = stack.pop()
        for user in base.users:
            if user not in views and _returns_view(user) and user.args[0] is base:
                views.add(user)
                stack.append(user)
    return views


def _returns_view(node):
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def _forward_graph(j, saved):
    """primals -> (*forward_outputs, *saved)."""
    return _extract(j.module, inputs=j.primals, outputs=j.forward_outputs + saved)


def _backward_graph(j, saved):
    """(*saved, *tangents) -> gradients; recomputes whatever it needs that was not saved."""
    gm = _extract(j.module, inputs=saved + j.tangents, outputs=j.gradients)
    leaked = [n.name for n in gm.graph.nodes if n.op == "placeholder"][len(saved) + len(j.tangents):]
    assert not leaked, f"partition bug: backward reads unsaved forward inputs {leaked}"
    return gm


def _extract(module, inputs, outputs):
    """A new GraphModule computing `outputs` from `inputs`, copying the nodes between them (and
    the constants they read from `module`)."""
    new = fx.Graph()
    env = {}
    for n in inputs:
        env[n] = new.placeholder(n.name)
        env[n].meta = dict(n.meta)
    needed = _ancestors((o for o in outputs if isinstance(o, fx.Node)), stop=set(inputs))
    for n in module.graph.nodes:
        if n in env or n not in needed:
            continue
        if n.op == "placeholder":  # an input the caller did not provide: caught by the caller
            env[n] = new.placeholder(n.name)
        else:
            env[n] = new.node_copy(n, env.__getitem__)
        env[n].meta = dict(n.meta)
    new.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    return fx.GraphModule(module, new)


def _ancestors(nodes, stop=frozenset()):
    """`nodes` and everything they are computed from, not looking past the nodes in `stop`."""
    seen, stack = set(), list(nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            if n not in stop:
                stack.extend(n.all_input_nodes)
    return seen


def _descendants(nodes):
    seen, stack = set(), list(nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.users)
    return seen


class _FlowNetwork:
    """Max flow by shortest augmenting paths (Edmonds-Karp); graphs here have hundreds of nodes."""

    def __init__(self):
        self.capacity = collections.defaultdict(lambda: collections.defaultdict(float))

    def add(self, u, v, cap):
        self.capacity[u][v] += cap
        self.capacity[v][u] += 0  # the residual edge must exist for the search

    def min_cut_source_side(self):
        """Push maximum flow from "source" to "sink"; return the nodes still reachable from the
        source in the residual graph."""
        while True:
            parent = self._bfs()
            if "sink" not in parent:
                return set(parent)
            path, v = [], "sink"
            while v != "source":
                path.append((parent[v], v))
                v = parent[v]
            push = min(self.capacity[u][v] for u, v in path)
            if push == math.inf:
                raise RuntimeError("partition bug: the backward needs a value that cannot be saved")
            for u, v in path:
                self.capacity[u][v] -= push
                self.capacity[v][u] += push

    def _bfs(self):
        parent, queue = {"source": None}, collections.deque(["source"])
        while queue:
            u = queue.popleft()
            for v, cap in self.capacity[u].items():
                if cap > 0 and v not in parent:
                    parent[v] = u
                    if v == "sink":
                        return parent
                    queue.append(v)
        return parent
