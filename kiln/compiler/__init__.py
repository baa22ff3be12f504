"""kiln's compiler (backend "inductor"): aot -> lower -> schedule -> codegen -> build -> wrapper.

`compile_fx` takes a torch-level fx graph (the backend contract); `compile_aten` takes a
functional aten graph (what aot and training produce) and returns a callable over flat inputs
returning a flat tuple. The callable carries the inspection API: `kiln_kernels` (KernelInfo per
generated kernel), `kiln_source` (the C++), `kiln_wrapper` (the Python wrapper),
`kiln_fallbacks` (aten ops called because they have no lowering).
"""
import torch

from kiln.config import compiler_options
from kiln.debug.logs import log


def compile_fx(gm, example_inputs, options=None, inner="cpp"):
    """Compile a torch-level fx graph for `example_inputs`."""
    options = options if options is not None else compiler_options()
    if torch.is_grad_enabled() and (any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
                                    or any(p.requires_grad for p in gm.parameters())):
        from kiln.compiler.training import compile_training
        return compile_training(gm, example_inputs, options, inner)
    from kiln.compiler import aot
    try:
        aten = aot.trace_aten(gm, example_inputs, aot.lowering_decompositions(options.get("fallback_random", False)))
    except aot.AotUnsupported as e:
        log("perf_hints", "graph runs eagerly: %s", e)
        return _inspectable(lambda *args: gm.forward(*args), [], "", "", ["<whole graph>"])
    if inner == "eager":
        return aot.make_runner(aten, aten.gm.forward)
    return aot.make_runner(aten, compile_aten(aten.gm, example_inputs, options, fx_gm=gm))


def compile_aten(aten_gm, example_inputs, options=None, *, fx_gm=None):
    """Compile a functional aten graph; returns callable(*flat inputs) -> flat tuple."""
    from kiln.compiler.build import CompileError

    options = options if options is not None else compiler_options()
    if _has_symbolic_scalars(aten_gm):
        log("perf_hints", "graph has symbolic sizes (dynamic shapes, or sizes read from tensor data): "
            "it runs through aten")
        return _run_through_aten(aten_gm)
    try:
        return _compile_to_cpp(aten_gm, example_inputs, options, fx_gm)
    except CompileError as e:  # kiln generated C++ that does not build: a kiln bug, not the user's
        if options.get("debug"):
            raise
        log("perf_hints", "generated C++ failed to build (%s): graph runs through aten", e.source_path)
        return _run_through_aten(aten_gm)


def _compile_to_cpp(aten_gm, example_inputs, options, fx_gm):
    from kiln.compiler import debug, wrapper
    from kiln.compiler.build import load_library
    from kiln.compiler.codegen import cpp
    from kiln.compiler.lower import GraphLowering
    from kiln.compiler.schedule import build_program, workspace_plan

    graph = GraphLowering(aten_gm, example_inputs, options).run()
    program = build_program(graph, options)
    offsets, ws_size = workspace_plan(program)
    source, entries = cpp.generate(program, offsets, options)
    lib = load_library(source, name_hint="graph", extra_flags=cpp.LINK_FLAGS) if entries else None
    fn, wrapper_source = wrapper.build(program, entries, lib, ws_size, len(example_inputs))
    debug.log_output_code(getattr(lib, "_name", None), source, wrapper_source)
    if options.get("trace.enabled"):
        folder = debug.write_trace(options, aten_gm=aten_gm, graph=graph, program=program, cpp_source=source,
                                   wrapper_source=wrapper_source, fx_gm=fx_gm)
        log("output_code", "debug trace written to %s", folder)
    return _inspectable(fn, debug.kernel_infos(program), source, wrapper_source, list(graph.fallbacks))


def _run_through_aten(aten_gm):
    return _inspectable(lambda *args: tuple(aten_gm(*args)), [], "", "", ["<whole graph>"])


def _inspectable(fn, kernels, source, wrapper_source, fallbacks):
    fn.kiln_kernels = kernels
    fn.kiln_source = source
    fn.kiln_wrapper = wrapper_source
    fn.kiln_fallbacks = fallbacks
    return fn


def _has_symbolic_scalars(gm):
    """Whether a node yields a symbolic scalar (sizes that depend on tensor data): the loop IR
    needs every size known when it compiles."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
            return True
    return False
