"""Schedule the IR: trace buffers into loop nodes, drop dead ones, fuse them into kernels, and
decide which buffers need memory at all.

- `trace`: one ComputedBuffer into a `LoopNode` (see loop_nodes) with symbolic loop variables
  (x* outer, r* reduction), its adjacent dims merged where every index allows (so most loops
  become 1-D or 2-D).
- `Kernel`: nodes that run in one loop nest. A kernel iterates (numel, rnumel): outer points,
  and for each, a reduction extent. A node joins a kernel when its iteration space fits
  (pointwise over numel*rnumel or over numel; reductions over (numel, rnumel)) and every read
  of a buffer made inside the kernel is at the very point that wrote it, so the outer loop can
  run in parallel and values can stay in registers. That one rule gives pointwise chains,
  prologue/epilogue fusion (softmax, layer_norm in one kernel) and horizontal fusion.
- `Program`: kernels and extern calls in order, plus each buffer's storage class.
"""
import dataclasses

import sympy
import torch
import torch.utils._pytree as pytree

from kiln.compiler import ir, provenance
from kiln.compiler.loop_nodes import LoopNode, loop_var, substitute
from kiln.compiler.schedule_sequential import trace_sequential


def trace(buf: ir.ComputedBuffer) -> LoopNode:
    data = buf.data
    if isinstance(data, (ir.Scan, ir.Scatter)):
        return trace_sequential(buf)
    reduction = isinstance(data, ir.Reduction)
    order = list(range(len(data.ranges))) if reduction else memory_order(buf.layout)
    outer = _vars_for(data.ranges, "x", order)
    inner = _vars_for(data.reduction_ranges, "r") if reduction else []
    body = data.inner_fn(tuple(outer), tuple(inner)) if reduction else data.inner_fn(tuple(outer))
    store = buf.layout.index(outer)
    sizes = [data.ranges[d] for d in order if data.ranges[d] != 1]
    rsizes = [s for s in data.reduction_ranges if s != 1] if reduction else []
    if 0 in sizes or 0 in rsizes:
        body, store, sizes, rsizes = _empty_loops(body, store, sizes, rsizes)
    else:
        body, store, sizes, rsizes = _merge_dims(body, store, sizes, rsizes)
    reads = {e.args[0] for e in body.loads()}
    return LoopNode(buf.name, buf.layout, sizes, rsizes, data.reduction_type if reduction else None,
                    body, store, reads)


def _empty_loops(body, store, sizes, rsizes):
    """A loop with no iterations is one loop of size 0 (a reduction over nothing still writes
    its initial value)."""
    zero = {loop_var(p, k): sympy.Integer(0) for p, dims in (("x", sizes), ("r", rsizes)) for k in range(len(dims))}
    sizes = [sympy.Integer(0)] if 0 in sizes else sizes
    rsizes = [sympy.Integer(0)] if 0 in rsizes else rsizes
    if sizes == [0]:
        return substitute(body, zero), sympy.Integer(0), sizes, rsizes
    rzero = {v: e for v, e in zero.items() if v.name.startswith("r")}
    return substitute(body, rzero), store, sizes, rsizes


def memory_order(layout):
    """The dims of `layout`, outermost loop first, so that a pointwise loop nest walks its output in
    memory order (a channels-last buffer: n, h, w, c): largest stride first, ties in logical order.
    Symbolic strides keep the logical order."""
    dims = list(range(len(layout.sizes)))
    if any(ir.is_symbolic(sympy.sympify(st)) for st in layout.strides):
        return dims
    return sorted(dims, key=lambda d: -int(layout.strides[d]) if layout.sizes[d] != 1 else 0)


def _vars_for(ranges, prefix, order=None):
    """Loop variables for `ranges` (in logical order), numbered over the dims that are not 1 (those
    index 0) in `order` (the loop order; default: logical)."""
    out, k = [sympy.Integer(0)] * len(ranges), 0
    for d in (range(len(ranges)) if order is None else order):
        if ranges[d] != 1:
            out[d] = loop_var(prefix, k)
            k += 1
    return out


def index_exprs(body, store):
    exprs = [store]
    for e in body.walk():
        if e.op == "load":
            exprs.append(e.args[1])
        elif e.op == "index":
            exprs.append(e.args[0])
    return exprs


def _mergeable(expr, outer, inner, inner_size):
    """expr uses (outer, inner) only as c*inner_size*outer + c*inner: they can be one variable."""
    if not ({outer, inner} & expr.free_symbols):
        return True
    if not expr.is_polynomial(outer, inner):
        return False
    c_outer, c_inner = expr.coeff(outer, 1), expr.coeff(inner, 1)
    rest = sympy.expand(expr - c_outer * outer - c_inner * inner)
    if {outer, inner} & (rest.free_symbols | c_outer.free_symbols | c_inner.free_symbols):
        return False
    return sympy.expand(c_outer - c_inner * inner_size) == 0


def _merge_dims(body, store, sizes, rsizes):
    """Merge adjacent loop dims that every index walks as one contiguous run."""
    renames = {}
    for prefix, dims in (("x", sizes), ("r", rsizes)):
        names = [loop_var(prefix, k) for k in range(len(dims))]
        exprs = [sympy.expand(e) for e in index_exprs(body, store)]
        k = len(dims) - 2
        while k >= 0:
            a, b = names[k], names[k + 1]
            if all(_mergeable(e, a, b, dims[k + 1]) for e in exprs):
                # the merged variable keeps b's name: a*size_b + b == merged
                exprs = [sympy.expand(e.xreplace({a: sympy.Integer(0)})) for e in exprs]
                renames[a] = sympy.Integer(0)
                dims[k + 1] = dims[k] * dims[k + 1]
                del dims[k], names[k]
            k -= 1
        for new_k, name in enumerate(names):
            if name != loop_var(prefix, new_k):
                renames[name] = loop_var(prefix, new_k)
    if not renames:
        return body, store, sizes, rsizes
    return substitute(body, renames), sympy.expand(store.xreplace(renames)), sizes, rsizes


# ---- kernels ------------------------------------------------------------------------------

@dataclasses.dataclass
class Kernel:
    name: str
    nodes: list
    numel: sympy.Expr
    rnumel: sympy.Expr = sympy.Integer(1)
    provenance: list = dataclasses.field(default_factory=list)  # comment lines: its aten ops, user lines

    def role(self, node):
        """How `node` runs here: 'reduction', 'inner' (every point) or 'outer' (once per outer point)."""
        if node.is_reduction:
            return "reduction"
        return "inner" if node.numel == self.numel * self.rnumel else "outer"

    def dims(self):
        """(outer sizes, inner sizes) of the loop nest: the common refinement of the nodes' dims,
        or (None, None) when the nodes' dims do not nest."""
        if len(self.nodes) == 1:  # its own dims (no ordering of symbolic sizes to get wrong)
            return list(self.nodes[0].sizes), list(self.nodes[0].reduction_sizes)
        outer, inner = {self.numel}, {self.rnumel}
        for node in self.nodes:
            role = self.role(node)
            if role == "reduction":
                outer |= _suffix_products(node.sizes)
                inner |= _suffix_products(node.reduction_sizes)
            elif role == "outer":
                outer |= _suffix_products(node.sizes)
            else:
                for b in _suffix_products(node.sizes):
                    if _divides(b, self.rnumel):
                        inner.add(b)
                    elif _divides(self.rnumel, b):
                        outer.add(b / self.rnumel)
                    else:
                        return None, None
        return _chain_sizes(outer), _chain_sizes(inner)

    def var_map(self, node, outer_sizes, inner_sizes):
        """node var -> expression over the kernel's loop vars (x* outer, r* inner)."""
        ovars = [loop_var("x", k) for k in range(len(outer_sizes))]
        ivars = [loop_var("r", k) for k in range(len(inner_sizes))]
        role = self.role(node)
        if role == "reduction":
            mapping = _map_vars(node.vars(), node.sizes, ovars, outer_sizes)
            mapping.update(_map_vars(node.rvars(), node.reduction_sizes, ivars, inner_sizes))
        elif role == "outer":
            mapping = _map_vars(node.vars(), node.sizes, ovars, outer_sizes)
        else:
            mapping = _map_vars(node.vars(), node.sizes, ovars + ivars, list(outer_sizes) + list(inner_sizes))
        return mapping


def _suffix_products(sizes):
    out, acc = set(), sympy.Integer(1)
    for s in reversed(sizes):
        acc = acc * s
        out.add(acc)
    return out


def _divides(a, b):
    """Whether a divides b (for symbolic sizes: provably)."""
    return a != 0 and (b / a).is_integer is True


def _chain_sizes(boundaries):
    """Loop sizes (outermost first) whose suffix products are exactly `boundaries`, or None."""
    chain = sorted({b for b in boundaries if b != 1}, key=ir.size_hint)  # then checked: each divides the next
    sizes, prev = [], sympy.Integer(1)
    for b in chain:
        if not _divides(prev, b):
            return None
        sizes.append(b / prev)
        prev = b
    return list(reversed(sizes))


def _map_vars(node_vars, node_sizes, kernel_vars, kernel_sizes):
    """Express each node var as a mixed-radix sum of the kernel vars that refine it."""
    mapping = {}
    k = len(kernel_vars)
    for v, s in zip(reversed(node_vars), reversed(node_sizes)):
        expr, scale, covered = sympy.Integer(0), sympy.Integer(1), sympy.Integer(1)
        while covered != s:
            if k == 0:  # the kernel's dims do not refine this node's (symbolic sizes that never match)
                raise ValueError(f"loop dims {kernel_sizes} do not refine size {s}")
            k -= 1
            expr += kernel_vars[k] * scale
            scale *= kernel_sizes[k]
            covered *= kernel_sizes[k]
        mapping[v] = expr
    return mapping


def _fits(kernel, node):
    """The (numel, rnumel) the kernel would have with `node` in it, or None."""
    if node.is_reduction:
        group = (node.numel, node.rnumel)
        if kernel.rnumel == 1 and all(n.numel in (group[0], group[0] * group[1]) and not n.is_reduction
                                      for n in kernel.nodes):
            return group
        return group if (kernel.numel, kernel.rnumel) == group else None
    if node.numel in (kernel.numel * kernel.rnumel, kernel.numel):
        return kernel.numel, kernel.rnumel
    return None


# the most nodes one kernel takes: a C compiler's time on one loop grows faster than its number of
# streams (the backward of x.unbind(1)[k] on 257 columns fills 256 zero slices: as one loop of 256
# stores, gcc -O3 took over 8 minutes and 3 GB; as four loops of 64, seconds)
MAX_KERNEL_NODES = 64


def try_fuse(kernel, node, epilogue_fusion=True):
    """Add `node` to `kernel` if legal (see the module doc); returns whether it did."""
    if len(kernel.nodes) >= MAX_KERNEL_NODES:
        return False
    if node.sequential is not None or any(n.sequential is not None for n in kernel.nodes):
        return False
    if not epilogue_fusion and not node.is_reduction and any(
            n.is_reduction and n.name in node.reads for n in kernel.nodes):
        return False
    group = _fits(kernel, node)
    if group is None:
        return False
    candidate = Kernel(kernel.name, kernel.nodes + [node], *group)
    outer, inner = candidate.dims()
    if outer is None or inner is None:
        return False
    in_kernel = {n.name: n for n in kernel.nodes}
    maps = {n.name: candidate.var_map(n, outer, inner) for n in candidate.nodes}
    for load in node.body.loads():
        name, index, bindings = load.args
        producer = in_kernel.get(name)
        if producer is None:
            continue
        if bindings or candidate.role(node) == "outer" and candidate.role(producer) == "inner":
            return False
        mine = sympy.expand(index.xreplace(maps[node.name]))
        theirs = sympy.expand(producer.store_index.xreplace(maps[producer.name]))
        if mine != theirs:
            return False
    kernel.nodes.append(node)
    kernel.numel, kernel.rnumel = group
    return True


# ---- the program ----------------------------------------------------------------------------

@dataclasses.dataclass
class Program:
    steps: list                  # Kernel | ir.ExternCall, in order
    buffers: dict                # name -> ir.Buffer (live ones)
    outputs: list                # from GraphLowering.outputs
    storage: dict                # name -> "input" | "output" | "tensor" | "workspace" | "local"
    readers: dict                # name -> set of step indices that read it


def build_program(graph, options=None, can_fuse=None) -> Program:
    """`can_fuse(kernel, node)`: what the kernel's device backend allows beyond the rules here
    (codegen/backend.DeviceBackends.can_fuse: one device per kernel)."""
    nodes = {b.name: trace(b) for b in graph.buffers if isinstance(b, ir.ComputedBuffer)}
    live = _live_buffers(graph, nodes)
    steps, current = [], None
    extern_seen = set()
    for buf in graph.buffers:
        if buf.name not in live:
            continue
        if isinstance(buf, ir.ComputedBuffer):
            node = nodes[buf.name]
            if current is None or (can_fuse is not None and not can_fuse(current, node)) or not try_fuse(
                    current, node, (options or {}).get("epilogue_fusion", True)):
                current = Kernel(f"kernel{len(steps)}", [node], node.numel, node.rnumel)
                steps.append(current)
        elif isinstance(buf, ir.ExternBuffer) and buf.call.name not in extern_seen:
            extern_seen.add(buf.call.name)
            steps.append(buf.call)
            current = None
    buffers = {n: graph.buffer_by_name[n] for n in live}
    provenance.name_kernels([s for s in steps if isinstance(s, Kernel)], graph.origins, graph.node_order)
    readers = _readers(steps)
    storage = _storage(steps, buffers, graph.outputs, readers)
    return Program(steps, buffers, graph.outputs, storage, readers)


def extern_reads(call):
    return {a.name for a in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(a, ir.BufferArg)}


def _live_buffers(graph, nodes):
    """Buffers the outputs need, and every extern with effects (random ops advance the generator
    as eager does)."""
    work = [name for kind, name, *_ in graph.outputs if kind == "buffer"]
    for buf in graph.buffers:
        if isinstance(buf, ir.ExternBuffer):
            target = buf.call.target
            if isinstance(target, torch._ops.OpOverload) and (
                    torch.Tag.nondeterministic_seeded in target.tags or buf.call.outputs is None
                    or target._schema.is_mutable):
                work.append(buf.name)
    live = set()
    while work:
        name = work.pop()
        if name in live:
            continue
        live.add(name)
        buf = graph.buffer_by_name[name]
        if isinstance(buf, ir.ComputedBuffer):
            work.extend(nodes[name].reads)
        elif isinstance(buf, ir.ExternBuffer):
            work.extend(extern_reads(buf.call))
            work.extend(b.name for b in graph.buffers if isinstance(b, ir.ExternBuffer) and b.call is buf.call)
    return live


def _readers(steps):
    readers = {}
    for k, step in enumerate(steps):
        names = extern_reads(step) if isinstance(step, ir.ExternCall) else set().union(*(n.reads for n in step.nodes))
        for name in names:
            readers.setdefault(name, set()).add(k)
    return readers


def _storage(steps, buffers, outputs, readers):
    """Where each live buffer lives: inputs and outputs are the caller's tensors, anything an
    extern touches is a tensor, a kernel value read only where it is in scope stays in a
    register ("local"), the rest goes in the per-call workspace."""
    output_names = {name for kind, name, *_ in outputs if kind == "buffer"}
    storage = {}
    for name, buf in buffers.items():
        if isinstance(buf, ir.InputBuffer):
            storage[name] = "input"
        elif isinstance(buf, ir.ConstantBuffer):
            storage[name] = "constant"
        elif name in output_names:
            storage[name] = "output"
        elif isinstance(buf, ir.ExternBuffer):
            storage[name] = "tensor"
    for step in steps:
        if isinstance(step, ir.ExternCall):
            for name in extern_reads(step):
                storage.setdefault(name, "tensor")
    for k, step in enumerate(steps):
        if isinstance(step, Kernel):
            for node in step.nodes:
                if node.name not in storage:
                    outside = readers.get(node.name, set()) - {k}
                    if outside:
                        storage[node.name] = "workspace"
                    elif _only_read_in_scope(step, node.name):
                        storage[node.name] = "local"
                    else:
                        storage[node.name] = "row" if _fits_a_row(step, node) else "workspace"
    return storage


# a value computed in one loop of a reduction kernel and read by a later loop at the same outer
# point lives in a per-thread array of one row (e.g. softmax's exp(x - max)), up to this size
MAX_ROW_ELEMENTS = 16384


def _fits_a_row(kernel, node):
    # a row of symbolic length lives in a per-thread buffer that grows to the longest row seen
    return (kernel.role(node) == "inner" and kernel.rnumel != 1
            and (not kernel.rnumel.is_number or int(kernel.rnumel) <= MAX_ROW_ELEMENTS))


def _only_read_in_scope(kernel, name):
    """A value made in `kernel` can live in a register when its readers run where it is in scope:
    anything after a reduction or outer node, or the same stage as an inner node."""
    stages = kernel_stages(kernel)
    for s, stage in enumerate(stages):
        for node in stage:
            if node.name == name:
                if kernel.role(node) in ("reduction", "outer"):
                    return True
                return all(name not in n.reads for later in stages[s + 1:] for n in later)
    return True


def kernel_stages(kernel):
    """Group the kernel's nodes into loops run one after the other per outer point: a node joins
    the last loop unless it runs at another level or needs a reduction that loop computes."""
    stages = []
    for node in kernel.nodes:
        level = "outer" if kernel.role(node) == "outer" and kernel.rnumel != 1 else "inner"
        if stages:
            last = stages[-1]
            last_level = "outer" if kernel.role(last[0]) == "outer" and kernel.rnumel != 1 else "inner"
            pending = {n.name for n in last if n.is_reduction}
            if last_level == level and not (node.reads & pending):
                last.append(node)
                continue
        stages.append([node])
    return stages
