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
from kiln.compiler.memory_plan import storage_bytes
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
    views = _Views(src, program)
    for name, buf in buffers.items():
        if isinstance(buf, (ir.InputBuffer, ir.ConstantBuffer)) and not any(
                map(ir.is_symbolic, (*buf.layout.sizes, *buf.layout.strides))):  # (guards proved these)
            views.actual[name] = buf.layout
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
                        views.same_memory(n.name, memory.inplace[n.name], n.layout)
                    elif storage[n.name] in ("output", "tensor"):
                        layout = views.allocation(n.name, n.layout)
                        device = "" if layout.device == ir.CPU else f", device={src.constant(layout.device, 'device')}"
                        src.line(f"{n.name} = empty_strided({_ints(layout.sizes)}, {_ints(layout.strides)}, "
                                 f"dtype={src.literal(layout.dtype)}{device})")
            compiled.emit_call(src, entry, float_names)
            done = range(k, step_index[id(entry.kernels[-1])] + 1)
        else:
            _extern(src, step, buffers, kernel_read, views)
            done = (k,)
        # drop what no later step reads, so the allocator hands its memory to the next step
        dead = [name for j in done for name in release.get(j, ())]
        if ws_size and workspace_until in done:
            dead.append("ws")
        dead += views.drop(dead)
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


class _Views:
    """The tensors a call holds and the views externs read, made once per call: a view with the
    layout its tensor already has is the tensor itself; one read twice is made once (`as_strided`
    costs a few microseconds of Python per call, and a transformer's wrapper makes dozens)."""

    def __init__(self, src, program):
        self.src = src
        self.needs_own = _needs_own_layout(program)
        self.extern_views = _extern_views(program)
        self.actual = {}   # name -> the layout of the tensor bound to it (where the wrapper knows it)
        self._made = {}    # (name, sizes, strides, offset) -> the variable holding that view
        self._of = {}      # name -> the view variables made from it (dropped with it)

    def same_memory(self, name, over, layout):
        """Bind `name` (a kernel writes it with `layout`) to the memory of buffer `over`. Kernels
        and views only read a tensor's memory and storage offset, so `over` itself serves, unless
        the tensor is used whole (returned, or an extern's argument as it is)."""
        own = self.actual.get(over)
        if name in self.needs_own and not (own is not None and _same_shape(own, layout)):
            self.src.line(f"{name} = {over}.as_strided({_ints(layout.sizes)}, {_ints(layout.strides)})")
            self.actual[name] = layout
            return
        self.src.line(f"{name} = {over}")
        if own is not None:
            self.actual[name] = own

    def allocation(self, name, layout):
        """The layout to allocate kernel-written buffer `name` with: the one layout externs read it
        through, where the buffer is only memory to the call and that layout spans the same bytes
        (a kernel writes `(2, 64, 32)`, a matmul reads it as `(128, 32)`)."""
        seen = self.extern_views.get(name, set())
        if name not in self.needs_own and len(seen) == 1:
            view = next(iter(seen))
            if view.offset == 0 and view.dtype == layout.dtype and not ir.is_symbolic(storage_bytes(layout)) \
                    and storage_bytes(view) == storage_bytes(layout):
                layout = view
        self.actual[name] = layout
        return layout

    def view(self, name, layout):
        """An expression for buffer `name` seen through `layout` (offset relative to its own)."""
        own = self.actual.get(name)
        if own is not None and _same_shape(own, layout) and layout.offset == 0:
            return name
        key = (name, tuple(layout.sizes), tuple(layout.strides), layout.offset)
        var = self._made.get(key)
        if var is None:
            var = self._made[key] = f"{name}_v{len(self._made)}"
            self._of.setdefault(name, []).append(var)
            self.src.line(f"{var} = {_view(name, layout)}")
        return var

    def drop(self, names):
        """The view variables to delete with `names` (their last reader has run)."""
        return [var for name in names for var in self._of.pop(name, ())]


def _same_shape(a, b):
    return tuple(a.sizes) == tuple(b.sizes) and tuple(a.strides) == tuple(b.strides)


def _extern_views(program):
    """{buffer: the layouts extern calls read it through}"""
    seen = {}
    for step in program.steps:
        if isinstance(step, ir.ExternCall):
            for a in pytree.tree_leaves((step.args, step.kwargs)):
                if isinstance(a, ir.BufferArg) and a.layout is not None:
                    seen.setdefault(a.name, set()).add(a.layout)
    return seen


def _needs_own_layout(program):
    """Buffers the call uses as whole tensors, not only as memory: outputs returned as they are
    and extern arguments passed as they are."""
    used = {value for kind, value, *rest in program.outputs if kind != "value" and not (rest and rest[0] is not None)}
    for step in program.steps:
        if isinstance(step, ir.ExternCall):
            used |= {a.name for a in pytree.tree_leaves((step.args, step.kwargs))
                     if isinstance(a, ir.BufferArg) and a.layout is None}
    return used


def raise_failed_check(src, sites, err="err"):
    """After an entry returns: raise the error of the check that failed, if one did (its code is in
    err[0], the index and bound it saw in err[1:]); see codegen/cpp_memory."""
    src.line(f"if {err}[0]:")
    for site in sites:
        error = src.constant(site.error, "error")
        src.line(f"if {err}[0] == {site.code}: raise {error}({site.message!r}.format(index={err}[1], bound={err}[2]))", 2)


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
    offset = sympy.sympify(layout.offset)
    if offset == 0:  # as_strided keeps the tensor's own storage offset when given none (a call less)
        return f"{name}.as_strided({_ints(layout.sizes)}, {_ints(layout.strides)})"
    return (f"{name}.as_strided({_ints(layout.sizes)}, {_ints(layout.strides)}, "
            f"{name}.storage_offset() + {pyexpr(offset)})")


def _extern(src, call, buffers, kernel_read, views):
    def arg(a):
        if isinstance(a, ir.BufferArg):
            return a.name if a.layout is None else views.view(a.name, a.layout)
        if isinstance(a, (list, tuple)):
            return _sequence([arg(x) for x in a], isinstance(a, list))
        return src.literal(a)
    op, op_args = _as_linear(call, views) or (call.target, call.args)
    args = [arg(a) for a in op_args] + [f"{k}={arg(v)}" for k, v in call.kwargs.items()]
    binding = _python_binding(op)
    target = src.constant(op if binding is None else binding, "aten_")
    if binding is None and isinstance(op, torch._ops.OpOverload) and hasattr(op, "_op"):
        target += "._op"  # the op's C++ callable: what OpOverload.__call__ calls, a Python frame less
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
            strides = _ints(layout.strides)  # (checked here: a Python call less per extern)
            src.line(f"if {name}.stride() != {strides}: {name} = fix_layout({name}, {_ints(layout.sizes)}, {strides})")
            views.actual[name] = layout


_BINDING_MODULES = (torch._C._VariableFunctions, torch._C._nn)


def _python_binding(op):
    """torch's own Python binding of aten op `op` (torch.convolution for aten.convolution.default) where
    it can only mean `op`: the op's only overload but its out= variants, functional. It parses its
    arguments in C++ where `op._op` converts them through the schema, boxed: one thread, a channels-last
    2x144x56x56 depthwise convolution 507 -> 486 us, a 2x96x1x1 one 9.8 -> 4.9 us per call.
    None for any other op."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or op._overloadname != "default" \
            or op._schema.is_mutable:
        return None
    packet = op.overloadpacket
    for name in packet.overloads():
        if name != "default" and not any(a.is_out for a in getattr(packet, name)._schema.arguments):
            return None
    for module in _BINDING_MODULES:
        binding = getattr(module, packet.__name__, None)
        if binding is not None:
            return binding
    return None


_MATMULS = {torch.ops.aten.addmm.default: 1, torch.ops.aten.mm.default: 0}  # op -> position of its first matrix


def _as_linear(call, views):
    """(aten.linear, its arguments) for addmm(b, x, w.t()) and mm(x, w.t()) where the call holds w as
    the matrix whose transpose is read: for a 2-d x, linear makes that very addmm or mm call, with
    w.t() taken in C++ instead of by the wrapper's as_strided (each nn.Linear of a model, each call).
    None for any other extern."""
    first = _MATMULS.get(call.target)
    if first is None or call.kwargs or len(call.args) != first + 2:
        return None
    w = call.args[first + 1]
    own = views.actual.get(w.name) if isinstance(w, ir.BufferArg) and w.layout is not None else None
    if own is None or len(own.sizes) != 2 or w.layout.offset != 0 or \
            (tuple(w.layout.sizes), tuple(w.layout.strides)) != (tuple(own.sizes)[::-1], tuple(own.strides)[::-1]):
        return None
    return torch.ops.aten.linear.default, (call.args[first], ir.BufferArg(w.name, None), *call.args[:first])
