"""Where and for how long each intermediate buffer of a compiled call lives.

A call should touch no more memory than eager does: eager frees a temporary as soon as its last
user has run, so the allocator hands the same (already mapped, cache-warm) memory to the next op.
The wrapper holds intermediates in Python locals; kept to the end of the call, every call would
map fresh pages for all of them (issue 15: 3x eager's page faults on MobileNetV2). So:

- `release_after`: the step after which each intermediate the wrapper holds is dropped (its
  last reader, or its producer when nothing reads it).
- `workspace_plan`: offsets in the one per-call workspace that holds kernel-to-kernel values no
  extern sees, reusing the space of values whose last reader has run.
"""
import sympy
from torch.utils._sympy.functions import FloorDiv

from kiln.compiler import ir
from kiln.compiler.schedule import Kernel, extern_reads


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


def release_after(program):
    """{step index: names of the Python-held buffers ("tensor" storage) dropped after that step}."""
    kept = kept_to_the_end(program)
    last = {}
    for k, step in enumerate(program.steps):
        for name in step_writes(step, program.buffers) | step_reads(step):
            last[name] = k
    out = {}
    for name, k in last.items():
        if program.storage.get(name) == "tensor" and name not in kept:
            out.setdefault(k, []).append(name)
    return {k: sorted(names) for k, names in out.items()}


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
