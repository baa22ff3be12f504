"""kiln's compiler (backend "inductor"): aot -> lower -> schedule -> codegen -> build -> wrapper.

`compile_fx` takes a torch-level fx graph (the backend contract); `compile_aten` takes a
functional aten graph (what aot and training produce) and returns a callable over flat inputs
returning a flat tuple. The callable carries the inspection API: `kiln_kernels` (KernelInfo per
generated kernel), `kiln_source` (the C++), `kiln_wrapper` (the Python wrapper),
`kiln_fallbacks` (aten ops called because they have no lowering).
"""
import torch
import torch.utils._pytree as pytree

from kiln.config import compiler_options, inert_options_set
from kiln.debug import report
from kiln.debug.logs import log


def compile_fx(gm, example_inputs, options=None, inner="cpp"):
    """Compile a torch-level fx graph for `example_inputs`."""
    options = options if options is not None else compiler_options()
    for name, why in inert_options_set(options):
        log("perf_hints", "option %s has no effect on CPU: %s", name, why)
    if torch.is_grad_enabled() and (any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
                                    or any(p.requires_grad for p in gm.parameters())):
        from kiln.compiler.grad_modes import compile_training
        if options.get("freezing"):
            log("perf_hints", "freezing applies to inference graphs (torch.no_grad()); this graph is "
                "compiled for training, its parameters as inputs")
        return compile_training(gm, example_inputs, options, inner)
    from kiln.compiler import freezing, graph_cache
    frozen = freezing.frozen_positions(gm, example_inputs, ()) if options.get("freezing") else []
    # a frozen graph bakes in tensor values, which the graph cache's key does not hold
    # (a compile report wants the IR and kernels, which a graph loaded from the cache does not have)
    cached = (graph_cache.lookup(gm, example_inputs, options) if inner == "cpp" and not frozen and not report.active()
              else graph_cache.Lookup(None))
    if cached.runner is not None:  # compiled by an earlier process: no aot, lowering or codegen
        return _eager_when_mutated_inputs_alias(cached.runner, gm)
    if graph_cache.needs_a_hit(gm):
        raise graph_cache.NotCached("a graph with symbolic sizes loaded from disk has no compiled form in the cache")
    from kiln.compiler import aot  # (make_fx, fake tensors, sympy: not needed for a graph the cache had)
    try:
        with report.stage("aot"):
            aten = aot.trace_aten(gm, example_inputs,
                                  aot.lowering_decompositions(options.get("fallback_random", False)))
    except aot.AotUnsupported as e:
        log("perf_hints", "graph runs eagerly: %s", e)
        return _inspectable(lambda *args: gm.forward(*args), [], "", "", ["<whole graph>"])
    if inner == "eager":
        return _eager_when_mutated_inputs_alias(aot.make_runner(aten, aten.gm.forward), gm)
    frozen = freezing.frozen_positions(gm, example_inputs, set(aten.mutated_inputs)) if frozen else []
    if frozen and inner == "cpp":
        flat_fn = freezing.FrozenGraph(aten.gm, example_inputs, frozen, lambda frozen_gm, inputs: compile_aten(
            frozen_gm, inputs, options, fx_gm=gm, inference=True))
    else:
        flat_fn = compile_aten(aten.gm, example_inputs, options, fx_gm=gm, inference=True)
        cached.store(aten, flat_fn)
    return _eager_when_mutated_inputs_alias(aot.make_runner(aten, flat_fn), gm)


def _eager_when_mutated_inputs_alias(runner, gm):
    """`runner`, which assumes the inputs it mutates share no memory with other inputs (the
    functional graph computes every value from the inputs as they were, then writes the new values
    back), or, on a call where one does (`g(t, t)` with g writing its first argument), the torch
    graph run eagerly, as eager's order of reads and writes decides the answer there."""
    from kiln.compiler.runner import mutated_inputs_alias
    mutated = getattr(runner, "kiln_mutated_inputs", ())
    if not mutated:
        return runner

    def run(*args):
        if mutated_inputs_alias(args, mutated):
            log("perf_hints", "a mutated input shares memory with another input: the graph runs eagerly")
            return gm.forward(*args)
        return runner(*args)
    for name in dir(runner):
        if name.startswith("kiln_"):
            setattr(run, name, getattr(runner, name))
    return run


def compile_aten(aten_gm, example_inputs, options=None, *, fx_gm=None, inference=False):
    """Compile a functional aten graph; returns callable(*flat inputs) -> flat tuple.
    `inference`: the graph is a whole inference call (no autograd graph on either side of it), so
    its intermediates' layouts are free to choose (layout_opt)."""
    from kiln.compiler import ir
    from kiln.compiler.build import CompileError
    from kiln.compiler.codegen.kernel_backend import BackendUnsupported

    options = options if options is not None else compiler_options()
    unsupported = _unsupported_symbols(aten_gm)
    if unsupported:
        log("perf_hints", "graph runs through aten: %s", unsupported)
        log("dynamic", "graph runs through aten: %s", unsupported)
        return _run_through_aten(aten_gm)
    try:
        with ir.indirect_scope():
            return _compile_to_kernels(aten_gm, example_inputs, options, fx_gm, inference)
    except BackendUnsupported as e:
        log("perf_hints", "graph runs through aten: %s", e)
        return _run_through_aten(aten_gm)
    except CompileError as e:  # kiln generated C++ that does not build: a kiln bug, not the user's
        if options.get("debug"):
            raise
        log("perf_hints", "generated C++ failed to build (%s): graph runs through aten", e.source_path)
        return _run_through_aten(aten_gm)
    except Exception as e:
        # symbolic sizes are newer ground than static ones: a compiler error there costs speed, not
        # the user's program
        if options.get("debug") or not _has_symbolic_sizes(aten_gm):
            raise
        log("perf_hints", "compiling a graph with symbolic sizes raised %s: %s; it runs through aten",
            type(e).__name__, e)
        log("dynamic", "graph with symbolic sizes runs through aten: compiling it raised %s: %s",
            type(e).__name__, e)
        return _run_through_aten(aten_gm)


def _compile_to_kernels(aten_gm, example_inputs, options, fx_gm, inference):
    from kiln.compiler import debug, ir_ops, layout_opt, onednn_fusion, wrapper
    from kiln.compiler.lower import GraphLowering
    from kiln.compiler.memory_plan import plan_memory
    from kiln.compiler.schedule import build_program

    output_metas = None
    if inference and options.get("layout_optimization", True) and layout_opt.wants_channels_last(aten_gm):
        aten_gm, output_metas = layout_opt.channels_last_convolutions(aten_gm)
        if output_metas is not None and onednn_fusion.available():
            onednn_fusion.prepack_convolutions(aten_gm)  # frozen weights only
    with report.stage("lowering"):
        graph = GraphLowering(aten_gm, example_inputs, options, output_metas).run()
        _check_bound(graph, aten_gm)
    with report.stage("scheduling"):
        program = build_program(graph, options, graph.backends.can_fuse)
        if options.get("debug"):
            ir_ops.verify(program)
        graph.backends.plan_storage(program)  # may raise BackendUnsupported
        memory = plan_memory(program)
    with report.stage("codegen"):  # (each backend's build is timed as its own stage inside)
        symbols = sorted(graph.symbol_sources, key=str)
        compiled = graph.backends.compile(program, memory, options, symbols)  # one CompiledKernels per backend
        source = "\n".join(c.source for c in compiled)
        fn, wrapper_source = wrapper.build(program, compiled, memory, len(example_inputs), graph.symbol_sources)
    debug.log_output_code(next((c.library_name for c in compiled if c.library_name), None), source, wrapper_source)
    report.graph_compiled(aten_gm=aten_gm, graph=graph, program=program, source=source,
                          wrapper_source=wrapper_source)
    if options.get("triton.cudagraphs"):  # mode="reduce-overhead" (training: forward and backward each)
        from kiln.compiler import cudagraphs
        fn = cudagraphs.wrap(fn, program, compiled, example_inputs)
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


def _symbolic_values(gm):
    """Every SymInt/SymFloat/SymBool in the graph's values (sizes, strides, scalars)."""
    for node in gm.graph.nodes:
        for val in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                yield val
            elif isinstance(val, torch.Tensor):
                yield from (s for s in (*val.shape, *val.stride(), val.storage_offset())
                            if isinstance(s, torch.SymInt))


def _has_symbolic_sizes(gm):
    return any(True for _ in _symbolic_values(gm))


def _unsupported_symbols(gm):
    """Why the loop IR cannot take this graph's symbolic values, or None. Kernels take sizes over
    input-backed symbols (s0, s1, ...) as arguments, and floats computed from them; a size read from
    tensor data (an unbacked symbol, u0) or a symbolic bool has no place in them."""
    for val in _symbolic_values(gm):
        if isinstance(val, torch.SymBool):
            return f"a symbolic {type(val).__name__} ({val.node.expr})"
        unbacked = [s for s in val.node.expr.free_symbols if not s.name.startswith("s")]
        if unbacked:
            return f"a size that depends on tensor data ({unbacked[0]})"
    return None


def _check_bound(graph, gm):
    """Every symbol the graph's sizes use must be readable from an input when it runs."""
    free = set()
    for val in _symbolic_values(gm):
        free |= val.node.expr.free_symbols
    missing = free - set(graph.symbol_sources)
    if missing:
        raise ValueError(f"size symbols {sorted(map(str, missing))} have no input to read them from")
