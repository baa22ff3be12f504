"""The Python wrapper of a compiled graph: generated source, as little work per call as possible.

Everything is decided at compile time; per call the wrapper allocates outputs (eager's strides)
and one workspace, calls each native entry once with data pointers, calls aten for externs, drops
each intermediate after its last reader (memory_plan), and returns the outputs. With dynamic shapes it first reads each size symbol from an input
(`s0 = arg0.size(1)`); sizes, strides and extern arguments are Python expressions over them.
"""
import ctypes
import math
import re

import sympy
import torch
import torch.utils._pytree as pytree
from torch.utils._sympy.printers import PythonPrinter

from kiln.compiler import ir
from kiln.compiler.runner import fix_layout
from kiln.compiler.schedule import Kernel


class _Source:
    def __init__(self):
        self.lines, self.globals = [], {"torch": torch, "empty_strided": torch.empty_strided, "ctypes": ctypes,
                                        "fix_layout": fix_layout}

    def line(self, text, indent=1):
        self.lines.append("    " * indent + text)

    def constant(self, value, hint):
        name = f"{hint}{len(self.globals)}"
        self.globals[name] = value
        return name

    def literal(self, value):
        """Python source for a non-tensor extern argument."""
        if value is None or isinstance(value, (bool, str, torch.dtype)):
            return repr(value) if not isinstance(value, torch.dtype) else str(value)
        if isinstance(value, int):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({repr(str(value))})"
        if isinstance(value, (list, tuple)):
            return _sequence([self.literal(v) for v in value], isinstance(value, list))
        if isinstance(value, sympy.Basic):  # a size expression: evaluated from the bound symbols
            return pyexpr(value)
        return self.constant(value, "c")


def build(program, compiled, memory, num_inputs, symbols=None):
    """Returns (callable(*inputs) -> tuple, the wrapper's source). `compiled`: each kernel backend's
    `CompiledKernels` (codegen/backend), which writes the calls of its entries; `memory`: the memory_plan's
    MemoryPlan; `symbols`: {size symbol: Python source reading it from the inputs}, bound first on
    each call (dynamic shapes)."""
    src = _Source()
    storage, buffers = program.storage, program.buffers
    inputs = [f"arg{i}" for i in range(num_inputs)]
    src.lines.append(f"def kiln_graph({', '.join(inputs)}):")
    src.globals.setdefault("math", math)  # size expressions may print math.floor/ceil
    float_names = {s.name for s in symbols or () if not s.is_integer}
    ws_size = memory.workspace_bytes
    entries = [e for c in compiled for e in c.entries]
    for name, buf in buffers.items():
        if isinstance(buf, ir.ConstantBuffer):
            src.line(f"{name} = {src.constant(buf.value, 'attr')}")
    if ws_size:
        src.line(f"ws = torch.empty(({pyexpr(sympy.sympify(ws_size))},), dtype=torch.uint8)")
        src.line("ws_ptr = ws.data_ptr()")
    elif any(e.uses_workspace for e in entries):
        src.line("ws_ptr = None  # an empty workspace (zero-size buffers): NULL, never read")
    entry_of = {id(e.kernels[0]): (c, e) for c in compiled for e in c.entries}
    # extern results whose strides the compiled code relies on: read by kernels, or re-viewed with
    # as_strided (by a later extern or as an output). aten may return other strides than the trace
    # saw (e.g. flash attention's output follows its inputs' layout, and kiln may hand it buffers
    # laid out differently from the traced graph's), so these get fix_layout.
    kernel_read = set()
    for step in program.steps:
        if isinstance(step, Kernel):
            for n in step.nodes:
                kernel_read |= n.reads
        else:
            kernel_read |= {a.name for a in pytree.tree_leaves((step.args, step.kwargs))
                            if isinstance(a, ir.BufferArg) and a.layout is not None}
    kernel_read |= {value for kind, value, *rest in program.outputs if kind != "value" and rest and rest[0] is not None}
    release = memory.release
    step_index = {id(step): k for k, step in enumerate(program.steps)}
    workspace_until = max((step_index[id(e.kernels[-1])] for e in entries if e.uses_workspace), default=None)
    for k, step in enumerate(program.steps):
        if isinstance(step, Kernel):
            compiled, entry = entry_of.get(id(step), (None, None))
            if entry is None:
                continue  # a later kernel of an entry already called
            for kernel in entry.kernels:
                for n in kernel.nodes:
                    if n.name in memory.inplace:  # written over an input this kernel reads last
                        src.line(f"{n.name} = {_same_memory(memory.inplace[n.name], buffers, n.layout)}")
                    elif storage[n.name] in ("output", "tensor"):
                        layout = n.layout
                        device = "" if layout.device == ir.CPU else f", device={src.constant(layout.device, 'device')}"
                        src.line(f"{n.name} = empty_strided({_ints(layout.sizes)}, {_ints(layout.strides)}, "
                                 f"dtype={src.literal(layout.dtype)}{device})")
            compiled.emit_call(src, entry, float_names)
            done = range(k, step_index[id(entry.kernels[-1])] + 1)
        else:
            _extern(src, step, buffers, kernel_read)
            done = (k,)
        # drop what no later step reads, so the allocator hands its memory to the next step
        dead = [name for j in done for name in release.get(j, ())]
        if ws_size and workspace_until in done:
            dead.append("ws")
        if dead:
            src.line(f"del {', '.join(dead)}")
    outs = []
    for kind, value, *rest in program.outputs:
        if kind == "value":
            outs.append(src.literal(value))
        elif rest and rest[0] is not None:
            outs.append(_view(value, rest[0]))
        else:
            outs.append(value)
    src.line(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    _bind_symbols(src, symbols or {})
    code = "\n".join(src.lines) + "\n"
    scope = dict(src.globals)
    exec(compile(code, "<kiln wrapper>", "exec"), scope)
    return scope["kiln_graph"], code


def _same_memory(name, buffers, layout):
    """A tensor of `layout` over the memory of buffer `name` (the buffer itself when it has that layout)."""
    if buffers[name].layout.sizes == layout.sizes and buffers[name].layout.strides == layout.strides:
        return name
    return f"{name}.as_strided({_ints(layout.sizes)}, {_ints(layout.strides)})"


def raise_failed_check(src, sites):
    """After an entry returns: raise the error of the check that failed, if one did (its code is in
    err[0], the index and bound it saw in err[1:]); see codegen/cpp_memory."""
    src.line("if err[0]:")
    for site in sites:
        error = src.constant(site.error, "error")
        src.line(f"if err[0] == {site.code}: raise {error}({site.message!r}.format(index=err[1], bound=err[2]))", 2)


def _bind_symbols(src, symbols):
    """Read, first thing in the call, each size symbol the wrapper's lines use from its input, then
    compute the float symbols they use from the sizes."""
    def used(lines):
        return set(re.findall(r"\b[a-z]+\d+\b", "\n".join(lines)))
    floats = [f"    {s.name} = {source}" for s, source in sorted(symbols.items(), key=lambda kv: kv[0].name)
              if not s.is_integer and s.name in used(src.lines)]
    names = used(src.lines + floats)
    sizes = [f"    {s.name} = {source}" for s, source in sorted(symbols.items(), key=lambda kv: kv[0].name)
             if s.is_integer and s.name in names]
    src.lines[1:1] = sizes + floats


def _sequence(items, is_list=False):
    """Python source for a list or tuple of item sources."""
    if is_list:
        return f"[{', '.join(items)}]"
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"


def _ints(xs):
    return _sequence([pyexpr(sympy.sympify(x)) for x in xs])


_PRINTER = PythonPrinter()


def pyexpr(e):
    """A sympy size expression as Python over the bound symbols (an int literal when static)."""
    return str(int(e)) if e.is_number else _PRINTER.doprint(e)


def _view(name, layout):
    return (f"{name}.as_strided({_ints(layout.sizes)}, {_ints(layout.strides)}, "
            f"{name}.storage_offset() + {pyexpr(sympy.sympify(layout.offset))})")


def _extern(src, call, buffers, kernel_read):
    def arg(a):
        if isinstance(a, ir.BufferArg):
            return a.name if a.layout is None else _view(a.name, a.layout)
        if isinstance(a, (list, tuple)):
            return _sequence([arg(x) for x in a], isinstance(a, list))
        return src.literal(a)
    args = [arg(a) for a in call.args] + [f"{k}={arg(v)}" for k, v in call.kwargs.items()]
    target = src.constant(call.target, "aten_")
    results = call.outputs
    if isinstance(results, str):
        src.line(f"{results} = {target}({', '.join(args)})")
    else:
        src.line(f"{call.name} = {target}({', '.join(args)})")
        if results is not None:  # (with none, the call's name is dropped as its buffer: memory_plan)
            for path, name in pytree.tree_flatten_with_path(results)[0]:
                if name is not None:
                    src.line(f"{name} = {call.name}{''.join(f'[{p.idx}]' for p in path)}")
            src.line(f"del {call.name}")  # the results it holds are released one by one
    for name in pytree.tree_leaves(results):
        if name is not None and name in kernel_read:
            layout = buffers[name].layout
            src.line(f"{name} = fix_layout({name}, {_ints(layout.sizes)}, {_ints(layout.strides)})")
