"""Training graphs on disk: a fresh process that meets a graph an earlier one compiled for training
loads its compiled forward and backward and its signature, and runs no joint trace, partition,
lowering or codegen (nor imports make_fx, fake tensors or sympy).

- key: the graph cache's key of the torch graph and its example inputs (graph_cache.graph_key: the
  graph, the inputs' metadata with requires_grad, the parameters' metadata, the options, the global
  modes including grad mode, the versions and kiln's compiler sources), with "training" and the
  partitioner's `recompute` setting.
- value (`training/<key[:2]>/<key>.json`, sealed and written atomically as the graph cache's): the
  signature (which inputs need grad, which outputs alias inputs, which inputs are written), whether
  every saved value is a tensor, and the forward and the backward as graph_cache.describe_compiled
  describes a compiled aten graph. It is written when the backward compiles (its first call), so a
  process that never runs backward stores nothing.
- not cached (logged under KILN_LOGS=perf_hints): what the graph cache refuses (symbolic sizes, a
  graph that runs through aten, a global the wrapper holds that cannot be described), a compile
  report, and the compiler options that want the compile itself (graph_cache.enabled).
"""
import dataclasses
import hashlib
import json

import torch.utils._pytree as pytree

from kiln.compiler import build, graph_cache
from kiln.compiler.training_runtime import GraphSignature, TrainingRun, module_state
from kiln.debug import report
from kiln.debug.logs import log

FORMAT = 1


@dataclasses.dataclass
class Lookup:
    key: str | None                 # None: not kept on disk
    graph: TrainingRun | None = None  # the loaded graph on a hit
    storages: frozenset = frozenset()  # the example inputs' and parameters' storages (no baked constant shares one)
    gm: object = None
    guards_before: int = 0          # the ShapeEnv's guards when the compile began

    def store_when_complete(self, graph):
        """Store `graph` (a training.TrainingGraph) once its backward compiles too."""
        if self.key is None:
            return
        compile_backward = graph._compile_backward

        def compile_and_store(saved, tangents):
            backward = compile_backward(saved, tangents)
            self._store(graph, backward)
            return backward
        graph._compile_backward = compile_and_store

    def _store(self, graph, backward):
        try:
            graph_cache.check_no_new_guards(self)
            entry = {"format": FORMAT, "key": self.key, "signature": _describe_signature(graph.signature),
                     "saved_all_tensors": graph.plan.saved_all_tensors,
                     "forward": graph_cache.describe_compiled(graph.forward, {}, self.storages),
                     "backward": graph_cache.describe_compiled(backward, {}, self.storages)}
            graph_cache.check_plain(entry)
        except graph_cache.Uncacheable as e:
            graph_cache.stats.uncacheable += 1
            log("perf_hints", "training graph not kept in the graph cache: %s", e)
            return
        try:
            build._write_atomically(_entry_path(self.key), build.seal(entry))
        except OSError as e:  # a full disk costs the next process a compile, not this one its graph
            log("perf_hints", "training graph cache entry not written (%s)", e)
            return
        graph_cache.stats.stores += 1


def lookup(gm, example_inputs, options, inner, recompute):
    """The training graph an earlier process stored for `gm` on inputs like `example_inputs`
    (Lookup.graph), or a Lookup to store into."""
    if inner != "cpp" or report.active() or not graph_cache.enabled(options):
        return Lookup(None)
    try:
        graph_key = graph_cache.graph_key(gm, example_inputs, options)
    except graph_cache.Uncacheable as e:
        graph_cache.stats.uncacheable += 1
        log("perf_hints", "training graph not kept in the graph cache: %s", e)
        return Lookup(None)
    key = hashlib.sha256(json.dumps(["training", FORMAT, bool(recompute), graph_key]).encode()).hexdigest()
    found = Lookup(key, storages=frozenset(graph_cache.input_storages(gm, example_inputs)), gm=gm,
                   guards_before=graph_cache.guard_count(gm))
    entry = build.read_sealed(_entry_path(key), lambda e: e.get("format") == FORMAT and e.get("key") == key)
    if entry is not None:
        try:
            found.graph = _load(entry, gm)
        except Exception as e:  # a stale description (an op gone, a symbol missing): compile afresh
            log("perf_hints", "training graph cache entry %s could not be loaded (%s: %s): compiling again",
                key[:16], type(e).__name__, e)
    if found.graph is None:
        graph_cache.stats.misses += 1
    else:
        graph_cache.stats.hits += 1
        log("output_code", "training graph loaded from the graph cache (%s)", key[:16])
    return found


def _load(entry, gm):
    forward = graph_cache.load_compiled(entry["forward"], gm)
    backward = graph_cache.load_compiled(entry["backward"], gm)
    return TrainingRun(_rebuild_signature(entry["signature"]), entry["saved_all_tensors"], module_state(gm)[1],
                       forward, lambda saved, tangents: backward)


def _describe_signature(sig):
    try:
        out_spec = pytree.treespec_dumps(sig.out_spec)
    except Exception as e:  # a container type pytree cannot serialize (a namedtuple, a custom class)
        raise graph_cache.Uncacheable(f"the output structure cannot be saved ({type(e).__name__}: {e})") from None
    fields = {f.name: getattr(sig, f.name) for f in dataclasses.fields(sig) if f.name != "out_spec"}
    if not _plain(fields):
        raise graph_cache.Uncacheable("the signature holds symbolic sizes")
    return {**fields, "out_spec": out_spec}


def _plain(value):
    """Whether `value` is made of ints, bools, None and tuples only (JSON keeps it exactly)."""
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (int, bool)


def _rebuild_signature(form):
    fields = {name: graph_cache.tuples(value) for name, value in form.items() if name != "out_spec"}
    return GraphSignature(out_spec=pytree.treespec_loads(form["out_spec"]), **fields)


def _entry_path(key):
    return build.cache_subdir("training", key[:2]) / f"{key}.json"
