"""Seeing what the compiler made.

- `KernelInfo`: one generated kernel as the inspection API shows it (tests read
  `compiled.kiln_kernels`: names, which buffers each kernel computes, whether it reduces).
- `log_output_code`: KILN_LOGS=output_code prints the C++ and the wrapper with file paths.
- `write_trace`: option trace.enabled writes a folder per graph: the fx and aten graphs, the IR
  and the fused schedule (compiler/ir_printer), the generated code, and with trace.graph_diagram
  the graph and the schedule drawn as SVG (debug/diagram).
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


def log_output_code(source_path, cpp_source, wrapper_source):
    if enabled("output_code"):
        log("output_code", "C++ (%s):\n%s\nwrapper:\n%s", source_path or "<no kernels>", cpp_source, wrapper_source)


def write_trace(options, *, aten_gm, graph, program, cpp_source, wrapper_source, fx_gm=None):
    """Write the debug folder for one graph (fx graph, aten graph, IR, schedule, code and, with
    trace.graph_diagram, the diagrams); returns its path."""
    from kiln.compiler.ir_printer import print_ir, print_schedule
    root = pathlib.Path(options.get("trace.debug_dir") or os.path.join(os.getcwd(), "kiln_debug"))
    folder = root / f"graph_{os.getpid()}_{next(_graph_ids)}"
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "aten_graph.txt": aten_gm.print_readable(print_output=False),
        "ir.txt": print_ir(program, graph.origins),
        "schedule.txt": print_schedule(program),
        "kernels.cpp": cpp_source,
        "wrapper.py": wrapper_source,
    }
    if fx_gm is not None:
        files["fx_graph.txt"] = fx_gm.print_readable(print_output=False)
    if options.get("trace.graph_diagram"):
        from kiln.debug.diagram import fx_svg, schedule_svg
        files["schedule.svg"] = schedule_svg(program)
        files["fx_graph.svg"] = fx_svg(fx_gm) if fx_gm is not None else None
        if files["schedule.svg"] is None:
            log("output_code", "trace.graph_diagram: graphviz (the package and its dot program) is missing; "
                "no diagram drawn")
    for name, text in files.items():
        if text is not None:
            (folder / name).write_text(text)
    return folder
