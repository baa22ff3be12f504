"""Where and for how long each intermediate buffer of a compiled call lives.

A call should touch no more memory than eager does: eager frees a temporary as soon as its last
user has run, so the allocator hands the same (already mapped, cache-warm) memory to the next op.
The wrapper holds intermediates in Python locals; kept to the end of the call, every call would
map fresh pages for all of them (issue 15: 3x eager's page faults on MobileNetV2). So:

- `release_after`: the step after which each intermediate the wrapper holds is dropped (its
  last reader, or its producer when nothing reads it).
- `inplace_writes`: a kernel writes a value into the memory of an input it is the last reader of
  (batch norm + relu into the convolution's result), when every read of that input in the kernel
  is at the very element the value is stored to, before the store: the call then touches one
  buffer where eager touches two, and the memory is already in cache.
- `workspace_plan`: offsets in the one per-call workspace that holds kernel-to-kernel values no
  extern sees, reusing the space of values whose last reader has run.
"""
import dataclasses

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from kiln.compiler import ir
from kiln.compiler.schedule import Kernel, extern_reads


@dataclasses.dataclass
class MemoryPlan:
    workspace_offsets: dict     # workspace buffer name -> byte offset (a size expression)
    workspace_bytes: object     # the workspace's size (a size expression; 0: none)
    release: dict               # step index -> Python-held buffers dropped after that step
    inplace: dict               # kernel-written buffer -> the dead input whose memory it takes


def plan_memory(program):
    inplace = inplace_writes(program)
    for name in inplace:  # a value stored over a tensor's memory is a tensor, not workspace
        if program.storage[name] == "workspace":
            program.storage[name] = "tensor"
    offsets, size = workspace_plan(program)
    return MemoryPlan(offsets, size, release_after(program), inplace)


def step_reads(step):
    """Buffer names one step reads."""
    if isinstance(step, Kernel):
        return set().union(*(n.reads for n in step.nodes))
    return extern_reads(step)


def step_writes(step, buffers):
    """Buffer names one step produces."""
    if isinstance(step, Kernel):
        return {n.name for n in step.nodes}
    return {name for name, buf in buffers.items() if isinstance(buf, ir.ExternBuffer) and buf.call is step}


def kept_to_the_end(program):
    """Buffers the call returns (or returns views of): never released."""
    return {value for kind, value, *_ in program.outputs if kind == "buffer"}


def last_steps(program):
    """{buffer name: the last step that writes or reads it}."""
    last = {}
    for k, step in enumerate(program.steps):
        for name in step_writes(step, program.buffers) | step_reads(step):
            last[name] = k
    return last


def release_after(program):
    """{step index: names of the Python-held buffers ("tensor" storage) dropped after that step}."""
    kept = kept_to_the_end(program)
    out = {}
    for name, k in last_steps(program).items():
        if program.storage.get(name) == "tensor" and name not in kept:
            out.setdefault(k, []).append(name)
    return {k: sorted(names) for k, names in out.items()}


def inplace_writes(program):
    """{kernel-written buffer: the input whose memory it is written into} (see the module doc).
    The input may be read through values the kernel keeps in registers (batch norm's output, read
    by the silu that is stored), and a value written over a tensor may itself be written over by a
    later kernel (the SE block's x * scale over silu(bn(conv))): one buffer where eager has three."""
    viewed, kept, last = _maybe_viewed(program), kept_to_the_end(program), last_steps(program)
    owned = solely_owned(program, viewed)
    out = {}
    for k, step in enumerate(program.steps):
        if not isinstance(step, Kernel) or any(n.sequential is not None for n in step.nodes):
            continue
        for node in step.nodes:
            if program.storage[node.name] not in ("tensor", "output", "workspace") or node.is_reduction:
                continue
            for name in sorted(_reads_through_registers(program, step, node)):
                if (name in owned and name not in kept and last.get(name) == k and name not in out.values()
                        and _same_memory(program.buffers[name].layout, node.layout)
                        and _stores_each_element_once(node.layout)
                        and _reads_only_where_stored(step, node, name)):
                    out[node.name] = name
                    if node.name not in viewed and program.storage[node.name] != "output":
                        owned.add(node.name)  # a tensor now (plan_memory), and only this call's
                    break
    return out


def _reads_through_registers(program, kernel, node):
    """What `node` reads, directly or through values of its kernel that stay in registers."""
    reads, todo = set(), [node.name]
    nodes = {n.name: n for n in kernel.nodes}
    while todo:
        for name in nodes[todo.pop()].reads:
            if name in reads:
                continue
            reads.add(name)
            if name in nodes and program.storage.get(name) == "local":
                todo.append(name)
    return reads - {n for n in reads if program.storage.get(n) == "local"}


def _maybe_viewed(program):
    """Buffers an aten call reads that may return a view of them."""
    viewed = set()
    for step in program.steps:
        if isinstance(step, ir.ExternCall) and not _returns_fresh(step.target):
            viewed |= extern_reads(step)
    return viewed


def solely_owned(program, viewed=None):
    """Python-held buffers whose memory nothing else can reach: written by kiln's kernels, or
    results of aten ops whose schema says they alias no input, and never the argument of an aten
    call that may return a view of it."""
    viewed = _maybe_viewed(program) if viewed is None else viewed
    owned = set()
    for name, buf in program.buffers.items():
        if program.storage.get(name) != "tensor" or name in viewed:
            continue
        if isinstance(buf, ir.ComputedBuffer) or (isinstance(buf, ir.ExternBuffer) and _returns_fresh(buf.call.target)):
            owned.add(name)
    return owned


def _returns_fresh(target):
    return isinstance(target, torch._ops.OpOverload) and all(r.alias_info is None for r in target._schema.returns)


def _same_memory(a, b):
    """Whether a value of layout b can be stored in the memory of a buffer of layout a."""
    return a.dtype == b.dtype and a.device == b.device and not ir.is_symbolic(storage_bytes(a)) and \
        storage_bytes(a) == storage_bytes(b) > 0


def _stores_each_element_once(layout):
    """Whether no two elements of a static `layout` share memory. A kernel storing into an expanded
    layout (stride 0: `erf(t).expand(2, 4)` as the output) stores an element more than once, and
    over its input's memory the second store would read what the first one wrote."""
    dims = [(st, s) for s, st in zip(layout.sizes, layout.strides) if s != 1]
    if any(ir.is_symbolic(s) or ir.is_symbolic(st) for st, s in dims):
        return False
    reach = 0  # the furthest offset the smaller-stride dims reach
    for stride, size in sorted((abs(int(st)), int(s)) for st, s in dims):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _reads_only_where_stored(kernel, node, name):
    """Whether `node` may store into `name`'s memory: every load of `name` in the kernel is at the
    element `node` stores at that loop point, in `node` itself or a node before it (so each point
    reads its element before it is overwritten, and no point reads another's)."""
    if kernel.role(node) != "inner":
        return False
    outer, inner = kernel.dims()
    if outer is None or inner is None:
        return False
    store = sympy.expand(node.store_index.xreplace(kernel.var_map(node, outer, inner)))
    position = kernel.nodes.index(node)
    for i, other in enumerate(kernel.nodes):
        loads = [e for e in other.body.loads() if e.args[0] == name]
        if not loads:
            continue
        if i > position:
            return False
        mapping = kernel.var_map(other, outer, inner)
        if any(bindings or sympy.expand(index.xreplace(mapping)) != store for _, index, bindings in
               (e.args for e in loads)):
            return False
    return True


def workspace_plan(program):
    """Offsets (bytes) in one per-call workspace for the buffers kept there, reusing the space of
    buffers whose last reader has run (first fit). Returns ({name: offset}, total bytes).
    Buffers of symbolic size follow the others, one after another (no reuse): their offsets and
    the total are size expressions, evaluated when the graph runs."""
    births = {n.name: k for k, step in enumerate(program.steps) if isinstance(step, Kernel)
              for n in step.nodes if program.storage[n.name] == "workspace"}
    symbolic = [name for name in births if ir.is_symbolic(storage_bytes(program.buffers[name].layout))]
    placed, offsets, top = [], {}, 0   # placed: (offset, size, last step that reads it)
    for name in sorted(set(births) - set(symbolic), key=births.get):
        death = max(program.readers.get(name, set()) | {births[name]})
        size = (storage_bytes(program.buffers[name].layout) + 63) // 64 * 64
        offset = 0
        for o, s in sorted((o, s) for o, s, d in placed if d >= births[name]):
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        offsets[name] = offset
        placed.append((offset, size, death))
        top = max(top, offset + size)
    top = sympy.Integer(top)
    for name in sorted(symbolic, key=births.get):
        offsets[name] = top
        top = top + FloorDiv(storage_bytes(program.buffers[name].layout) + 63, 64) * 64
    return offsets, top


def storage_bytes(layout):
    """Bytes from a layout's first element to one past its last."""
    if any(s == 0 for s in layout.sizes):
        return 0
    extent = 1 + layout.offset + sum(((s - 1) * st for s, st in zip(layout.sizes, layout.strides)), sympy.Integer(0))
    if ir.is_symbolic(extent):  # a symbolic size may be 0 when it runs: never a negative size
        return sympy.Max(extent, 0) * layout.dtype.itemsize
    return int(extent) * layout.dtype.itemsize
