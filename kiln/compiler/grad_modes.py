"""`compile_training`: what compile_fx returns for a graph whose inputs or parameters require grad.

One graph may be called with inputs that require grad differently, or under no_grad; each grad
situation gets its own compiled code: the inference path when there is no gradient to compute,
else a training graph, loaded from the training-graph cache (training_cache.py) or traced and
partitioned (training.py, imported only then: make_fx, fake tensors and sympy stay unloaded in a
process whose training graphs all come from disk).
"""
import torch

from kiln.compiler import graph_cache
from kiln.compiler.training_runtime import detached
from kiln.debug import report
from kiln.debug.logs import log


def compile_training(gm, example_inputs, options, inner, *, recompute=True):
    """Compile `gm` for training; returns a callable over the flat inputs, as backends do.

    `recompute`: let the partitioner recompute cheap values in the backward instead of saving
    them (min-cut); False saves every forward value the backward reads."""
    return _GradModeVariants(gm, dict(options or {}), inner, recompute, example_inputs)


class _GradModeVariants:
    """The compiled graph for each grad situation seen."""

    def __init__(self, gm, options, inner, recompute, example_inputs):
        self.gm, self.options, self.inner, self.recompute = gm, options, inner, recompute
        self.params_need_grad = any(p.requires_grad for p in gm.parameters())
        self.variants = {}
        self.variants[self._key(example_inputs)] = self._compile(example_inputs)

    def __call__(self, *args):
        key = self._key(args)
        compiled = self.variants.get(key)
        if compiled is None:
            try:
                compiled = self._compile(args)
            except graph_cache.NotCached as e:  # (a graph from disk, no fake values to compile it with)
                log("perf_hints", "%s: this grad situation runs the graph eagerly", e)
                compiled = self.gm.forward
            self.variants[key] = compiled
        return compiled(*args)

    def _key(self, args):
        """(any gradient to compute, which inputs require grad)."""
        requires = tuple([isinstance(a, torch.Tensor) and a.requires_grad for a in args])
        return torch.is_grad_enabled() and (self.params_need_grad or any(requires)), requires

    def _compile(self, example_inputs):
        if not self._key(example_inputs)[0]:
            from kiln.compiler import compile_fx  # no gradient to compute: the inference path
            with torch.no_grad():
                return compile_fx(self.gm, detached(example_inputs), self.options, self.inner)
        from kiln.compiler import training_cache
        cached = training_cache.lookup(self.gm, example_inputs, self.options, self.inner, self.recompute)
        if cached.graph is not None:  # traced and compiled by an earlier process
            return cached.graph
        if graph_cache.needs_a_hit(self.gm):
            raise graph_cache.NotCached("a training graph with symbolic sizes loaded from disk has no compiled form "
                                        "in the cache")
        from kiln.compiler import aot
        from kiln.compiler.training import TrainingGraph
        try:
            with report.stage("aot"):  # the joint trace and partition; the two graphs' compiles time themselves
                graph = TrainingGraph(self.gm, example_inputs, self.options, self.inner, self.recompute)
        except (aot.AotUnsupported, *aot.DATA_DEPENDENT) as e:
            # as the inference path: a graph that needs tensor values to trace (sizes from tolist())
            # runs eagerly, and autograd records it as eager would
            log("perf_hints", "training graph runs eagerly: %s: %s", type(e).__name__, str(e).splitlines()[0])
            return self.gm.forward
        cached.store_when_complete(graph)
        return graph
