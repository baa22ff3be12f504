"""kiln's compiler (backend "inductor"): aot -> lower -> fuse -> codegen -> build -> wrapper.

Placeholder until the compiler lands: runs the graph as captured and says so under
KILN_LOGS=perf_hints.
"""
from kiln.debug.logs import log


def compile_fx(gm, example_inputs, options=None, inner="cpp"):
    """Compile a torch-level fx graph for `example_inputs`; returns a callable over flat inputs."""
    log("perf_hints", "compiler not built yet: graph runs eagerly (%d nodes)", len(gm.graph.nodes))
    return gm.forward
