"""Seeing what the compiler made.

- `KernelInfo`: one generated kernel as the inspection API shows it (tests read
  `compiled.kiln_kernels`: names, which buffers each kernel computes, whether it reduces).
- `log_output_code`: KILN_LOGS=output_code prints the C++ and the wrapper with file paths.
- `write_trace`: option trace.enabled writes a folder per graph: the aten graph, the IR, the
  fused schedule, and the generated code.
"""
import dataclasses
import itertools
import os
import pathlib

from kiln.debug.logs import enabled, log

_graph_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    name: str
    buffers: tuple        # buffer names computed in the kernel
    reductions: tuple     # reduction types in it
    numel: int
    rnumel: int


def kernel_infos(program):
    from kiln.compiler.schedule import Kernel  # (the IR and sympy: not needed to load a cached graph)
    return [KernelInfo(step.name, tuple(n.name for n in step.nodes),
                       tuple(n.reduction_type for n in step.nodes if n.is_reduction),
                       _int(step.numel), _int(step.rnumel))
            for step in program.steps if isinstance(step, Kernel)]


def _int(x):
    return int(x) if x.is_number else -1


def describe_ir(graph):
    from kiln.compiler import ir
    lines = []
    for buf in graph.buffers:
        kind = type(buf).__name__
        extra = ""
        if isinstance(buf, ir.ComputedBuffer):
            data = buf.data
            extra = (f" Reduction({data.reduction_type}, ranges={list(data.ranges)}, "
                     f"reduction_ranges={list(data.reduction_ranges)})" if isinstance(data, ir.Reduction)
                     else f" Pointwise(ranges={list(data.ranges)})")
        elif isinstance(buf, ir.ExternBuffer):
            extra = f" {buf.call.target}"
        lines.append(f"{buf.name}: {kind} sizes={list(buf.layout.sizes)} strides={list(buf.layout.strides)} "
                     f"{buf.layout.dtype}{extra}")
    return "\n".join(lines) + "\n"


def describe_schedule(program):
    from kiln.compiler.schedule import Kernel
    lines = []
    for step in program.steps:
        if isinstance(step, Kernel):
            lines.append(f"{step.name} [{step.numel} x {step.rnumel}]")
            for n in step.nodes:
                kind = n.reduction_type or "pointwise"
                lines.append(f"  {n.name}: {kind} sizes={n.sizes} rsizes={n.reduction_sizes} "
                             f"storage={program.storage[n.name]}  = {n.body!r}"[:400])
        else:
            lines.append(f"extern {step.name}: {step.target} -> {step.outputs}")
    return "\n".join(lines) + "\n"


def log_output_code(source_path, cpp_source, wrapper_source):
    if enabled("output_code"):
        log("output_code", "C++ (%s):\n%s\nwrapper:\n%s", source_path or "<no kernels>", cpp_source, wrapper_source)


def write_trace(options, *, aten_gm, graph, program, cpp_source, wrapper_source, fx_gm=None):
    """Write the debug folder for one graph; returns its path."""
    root = pathlib.Path(options.get("trace.debug_dir") or os.path.join(os.getcwd(), "kiln_debug"))
    folder = root / f"graph_{os.getpid()}_{next(_graph_ids)}"
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "aten_graph.txt": aten_gm.print_readable(print_output=False),
        "ir.txt": describe_ir(graph),
        "schedule.txt": describe_schedule(program),
        "kernels.cpp": cpp_source,
        "wrapper.py": wrapper_source,
    }
    if fx_gm is not None:
        files["fx_graph.txt"] = fx_gm.print_readable(print_output=False)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder
