"""The capture cache on disk: a fresh process that meets a frame it compiled before loads the entry an
earlier process stored (guards, glue, graph) instead of running capture, and its compiled graph from
the compiler's graph cache, so neither the symbolic interpreter nor make_fx nor fake tensors run.

- key (one directory per key, `capture/<key[:2]>/<key>/`): sha256 over the frame's code object
  (portable.code_fingerprint: bytecode, constants, names, closure layout), the backend (kiln's own
  only, with its options), fullgraph and dynamic, kiln's settings, the global modes the compiler
  reads, and the versions: torch, Python, and a hash of kiln's own sources.
- an entry (one sealed JSON file per entry, named by its digest, written atomically: concurrent
  writers of one key each add a file, none is ever half-read): the guard functions' source as
  another process checks them (guards.Guard.portable: a live nn.Module by its type, with every
  attribute capture read guarded by value), the glue's source, each constant either names
  (portable.describe: functions and classes by name *and* fingerprint, so a changed inlined
  function or class is Stale), the fx graph, and the expressions of its inputs.
- loading: the guards are rebuilt and checked on the call that missed; only the entry that passes
  is finished (its graph handed to the backend, which finds it in the graph cache; the glue built).
  A damaged file, a name that no longer resolves, a changed fingerprint, a backend that raises:
  the entry is dropped and capture runs, never a stale answer.
- symbolic sizes: the graph's placeholders carry their symbolic descriptions and the entry what the
  ShapeEnv knew (graph_cache keys the compiled graph by both); a loaded symbolic graph has no fake
  values, so only its compiled form from the graph cache may serve it (a miss: capture again).
  An entry also records what automatic dynamic had seen change when it was made, and loads only
  in that state (the state a capture would make the same entry in).
- not stored (logged under KILN_LOGS=perf_hints): entries whose guards check a live object other
  than an nn.Module by identity, whose glue holds an object only this process has (a cell, a code
  object other than a resume function's), aot_eager's symbolic graphs, user backends. After a graph
  break the glue's resume functions are stored by where they resume (offset, stack layout, live
  locals) and made again on load; each is a frame of its own, with entries of its own.
- `kiln.config.capture_cache` (KILN_CAPTURE_CACHE=0) turns it off.
"""
import dataclasses
import hashlib
import json
import pathlib
import re
import sys
import types

import torch

from kiln.config import config  # (the settings object: `kiln.config` names it once kiln is imported)
from kiln import sources_digest
from kiln.backends import registry
from kiln.capture import portable
from kiln.capture.cache_entry import CacheEntry, log_entry, log_graph
from kiln.capture.class_watch import ClassWatch
from kiln.capture.guards import SYMPY_PRINTER_NAMES, Guard, Liveness, compile_guards, first_failure_reporter
from kiln.capture.sources import AttrSource, CellSource, GlobalSource, ItemSource, LocalSource
from kiln.capture.variables import SetVariable
from kiln.debug.logs import log

FORMAT = 2  # 2: symbolic graphs (size facts, placeholder descriptions), the dynamism an entry was made under
_KILN_BACKENDS = ("inductor", "eager", "aot_eager")


@dataclasses.dataclass
class CaptureCacheStats:
    """What happened in this process (tests count these: a warm process captures nothing)."""
    captures: int = 0    # frames captured (the symbolic interpreter ran)
    loads: int = 0       # entries loaded from disk and used
    stores: int = 0      # entries written
    stale: int = 0       # stored entries refused (damaged, a function or class changed, ...)
    unportable: int = 0  # entries kept in this process only


stats = CaptureCacheStats()


# ---- storing --------------------------------------------------------------------------------------
def stored_form(og, glue, graph_fn, gm, glue_src, backend, code, caller):
    """The JSON-able form of a new entry another process can load, or None (logged why). `caller`: the
    runtime.Caller the glue calls at a graph break (callees, resume functions' caches)."""
    if not config.capture_cache or _backend_description(backend) is None:
        return None
    try:
        return _describe_entry(og, glue, graph_fn, gm, glue_src, backend, _GlueObjects(code, graph_fn, caller))
    except portable.Unportable as e:
        stats.unportable += 1
        log("perf_hints", "entry for %s kept in this process only (capture cache): %s", code.co_qualname, e)
        return None


def _describe_entry(og, glue, graph_fn, gm, glue_src, backend, glue_objects):
    if og.dynamic_inputs and backend.name == "aot_eager":  # (it would trace a loaded graph at one size)
        raise portable.Unportable("aot_eager's graph has symbolic sizes")
    if SetVariable.order_reads != og.set_order_reads:
        raise portable.Unportable("a set's iteration order was read (it follows this process's string hashing)")
    guard_sources = og.guards.sources(portable=True)
    if guard_sources is None:
        raise portable.Unportable("a guard checks a live object by identity")
    tags = {id(w.tag_ref): w.cls() for w in og.guards.ctx.consts.values()
            if isinstance(w, ClassWatch) and w.tag_ref is not None}
    inputs = [s.expr(glue.ctx) for s, _, _ in og.inputs] if graph_fn is not None else []
    return {
        "guards": list(guard_sources),
        "guard_texts": [g.text for g in og.guards.guards],
        "guard_consts": _describe_used(og.guards.ctx.consts, "".join(guard_sources), tags),
        "glue": glue_src,
        "glue_consts": {name: glue_objects.describe(value, tags) for name, value in _used(glue.ctx.consts, glue_src)},
        "graph": portable.graph_to_json(gm) if gm is not None else None,
        "size_facts": _size_facts(gm),
        "inputs": inputs,
        "input_values": [[_encode_source(s), list(v) if isinstance(v, tuple) else portable.describe(v, {})]
                         for s, v in og.input_values() if _encode_source(s) is not None],
    }


class _GlueObjects:
    """The objects of this process a frame's glue holds that the capture cache remakes on load: the
    compiled graph, the runtime's Caller, and after a graph break each resume function (its code, made
    again by resume.resume_code from the frame's code and the break's offset and layout, and its cache)."""

    def __init__(self, code, graph_fn, caller):
        self.code, self.graph_fn, self.caller = code, graph_fn, caller

    def describe(self, value, tags):
        if value is self.graph_fn:
            return ["graph"]
        if value is self.caller:
            return ["caller"]
        if value is types.FunctionType:  # (what makes a resume function; its name is not importable)
            return ["function_type"]
        spot = self._resume_spot(value)
        if spot is not None:
            return ["resume_code", *spot]
        rcode = self.caller.cached_code(value)  # a resume function's cache
        spot = self._resume_spot(rcode)
        if spot is not None and self.caller.resume_cache(rcode) is value:
            return ["resume_cache", *spot]
        return portable.describe(value, tags)

    def _resume_spot(self, value):
        if not isinstance(value, types.CodeType):
            return None
        from kiln.capture import resume
        return resume.resume_spot(value, self.code)

    @staticmethod
    def rebuild(desc, cache, caller):
        """The object `describe` described, for `cache` (the frame's runtime.CodeCache)."""
        kind = desc[0]
        if kind not in ("caller", "function_type", "resume_code", "resume_cache"):
            return portable.rebuild(desc)
        if kind == "caller":
            return caller
        if kind == "function_type":
            return types.FunctionType
        from kiln.capture import resume
        rcode = resume.resume_code(cache.code, desc[1], desc[2], desc[3])
        return rcode if kind == "resume_code" else caller.resume_cache(rcode)


def _size_facts(gm):
    """What the ShapeEnv knew about a symbolic graph's sizes (graph_cache keys its compiled form by
    it); None for a static graph."""
    from kiln.compiler import graph_cache
    if gm is None or graph_cache.symbolic_inputs(gm) is None:
        return None
    try:
        return graph_cache.size_facts(gm)
    except graph_cache.Uncacheable as e:
        raise portable.Unportable(str(e)) from None


def _used(consts, text):
    """The consts `text` names. The names are identifiers, so one pass over the text's words finds
    them all (a search per name was quadratic: minutes on a model with thousands of guards)."""
    words = set(re.findall(r"\w+", text))
    return [(name, value) for name, value in consts.items() if name in words]


def _describe_used(consts, text, tags):
    return {name: portable.describe_guard_value(value, tags) for name, value in _used(consts, text)}


def store(cache, entry):
    """Write `entry` (just captured for `cache`, a runtime.CodeCache) for later processes."""
    key = _key_of(cache)
    dynamism = _encode_dynamism(cache.dynamism)
    if key is None or entry.stored_form is None or dynamism is None:
        return
    from kiln.compiler import build
    body = {"format": FORMAT, "key": key, "dynamism": dynamism, "entry": entry.stored_form}
    data = build.seal(body)
    try:
        folder = build.cache_subdir("capture", key[:2], key)
        build._write_atomically(folder / f"{hashlib.sha256(data).hexdigest()[:32]}.json", data)
    except OSError as e:  # a full disk costs the next process a capture, not this one its entry
        log("perf_hints", "capture cache entry not written (%s)", e)
        return
    stats.stores += 1


# ---- loading --------------------------------------------------------------------------------------
def load(cache, F, L):
    """An entry an earlier process stored for this frame whose guards pass on (F, L), ready to run;
    None when there is none. Entries whose guards fail stay candidates for later misses."""
    if cache.stored is None:
        cache.stored = _read_entries(_key_of(cache))
    dynamism = _encode_dynamism(cache.dynamism)
    for candidate in list(cache.stored):
        if candidate.dynamism != dynamism:  # made after other sizes changed: capture would make another
            continue
        try:
            entry = candidate.ready(cache, F, L)
        except Exception as e:  # Stale, or anything a damaged entry makes fail: capture runs instead
            cache.stored.remove(candidate)
            stats.stale += 1
            log("perf_hints", "capture cache entry %s not used (%s: %s): capturing again",
                candidate.path.name, type(e).__name__, e)
            continue
        if entry is not None:
            cache.stored.remove(candidate)
            stats.loads += 1
            if entry.graph is not None:
                log_graph(cache.code, entry.graph)
            log_entry(cache.code, entry, f" (loaded from the capture cache, {candidate.path.name})")
            return entry
    return None


def _read_entries(key):
    if key is None:
        return []
    from kiln.compiler import build
    folder = build.cache_dir() / "capture" / key[:2] / key
    try:
        paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    except OSError:  # (a file gone between listing and stat: another process replaced it)
        return []
    found = []
    for path in paths[-config.cache_size_limit:]:  # the newest: a cache holds no more in memory
        body = build.read_sealed(path, lambda body: body.get("format") == FORMAT and body.get("key") == key)
        if body is not None:
            found.append(_Stored(path, body["entry"], body.get("dynamism")))
    return found


class _Stored:
    """One entry read from disk: its guards built on first use, the rest when they pass."""

    def __init__(self, path, form, dynamism):
        self.path, self.form, self.dynamism = pathlib.Path(path), form, dynamism
        self.check = self.guards = self.first_failure = None

    def ready(self, cache, F, L):
        if self.check is None:
            self._build_guards()
        if not self.check(F, L):
            return None
        form = self.form
        caller = cache.caller()
        consts = {name: _GlueObjects.rebuild(desc, cache, caller)
                  for name, desc in form["glue_consts"].items() if desc != ["graph"]}
        graph_names = [name for name, desc in form["glue_consts"].items() if desc == ["graph"]]
        gm = None
        if form["graph"] is not None:
            gm = portable.graph_from_json(form["graph"])
            if form["size_facts"] is not None:  # no fake values: only its compiled form from the cache serves
                gm.meta.update(kiln_size_facts=form["size_facts"], kiln_from_disk_symbolic=True)
            scope = {**SYMPY_PRINTER_NAMES, **consts, "F": F, "L": L, "G": F.__globals__}
            example_inputs = [eval(expr, scope) for expr in form["inputs"]]
            with torch.set_grad_enabled(torch.is_grad_enabled()):  # (the mode back after it, as compile_frame)
                graph_fn = cache.backend(gm, example_inputs)
            consts.update({name: graph_fn for name in graph_names})
        ns = {**SYMPY_PRINTER_NAMES, **consts}
        exec(compile(form["glue"], "<kiln glue>", "exec"), ns)
        input_values = [(_decode_source(s), tuple(v) if isinstance(v, list) else portable.rebuild(v))
                        for s, v in form["input_values"]]
        return CacheEntry(self.check, ns["__kiln_entry"], self.guards, self.first_failure, gm, None, form["glue"],
                          form["guards"][0], input_values, Liveness())

    def _build_guards(self):
        consts = {name: portable.rebuild(desc) for name, desc in self.form["guard_consts"].items()}
        check, failure = compile_guards(*self.form["guards"], {**SYMPY_PRINTER_NAMES, **consts})
        self.guards = [Guard(None, None, text, None) for text in self.form["guard_texts"]]
        self.first_failure = first_failure_reporter(failure, self.guards)
        self.check = check


# ---- the key --------------------------------------------------------------------------------------
def _key_of(cache):
    """The disk key of a runtime.CodeCache's frame, or None when its entries are not stored."""
    if cache.disk_key is False:
        cache.disk_key = _frame_key(cache.code, cache.backend, cache.fullgraph, cache.dynamic)
    return cache.disk_key


def _frame_key(code, backend, fullgraph, dynamic):
    if not config.capture_cache or code is None:
        return None
    backend_desc = _backend_description(backend)
    if backend_desc is None:
        return None
    from kiln.compiler import graph_cache
    parts = {
        "format": FORMAT,
        "code": portable.code_fingerprint(code),
        "backend": backend_desc, "fullgraph": fullgraph, "dynamic": dynamic,
        "settings": sorted([k, repr(v)] for k, v in config._values.items() if k != "cache_size_limit"),
        "modes": graph_cache._global_modes(),
        "versions": [torch.__version__, list(sys.version_info[:3]), sources_digest.digest("kiln")],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _backend_description(backend):
    """kiln's own backends by name and options; None for any other (it may compile anything)."""
    name = getattr(backend, "name", None)
    if name not in _KILN_BACKENDS or getattr(backend, "fn", None) is not registry.lookup_backend(name):
        return None
    return [name, sorted([k, repr(v)] for k, v in (backend.options or {}).items())]


# ---- sources (for automatic dynamic, which compares a loaded entry's input sizes too) ---------------
def _encode_source(s):
    if isinstance(s, LocalSource):
        return ["L", s.index, s.name]
    if isinstance(s, GlobalSource) and s.root:
        return ["G", s.name]
    if isinstance(s, CellSource):
        return ["cell", s.name, s.index]
    if isinstance(s, AttrSource):
        base = _encode_source(s.base)
        return None if base is None else ["attr", base, s.name]
    if isinstance(s, ItemSource) and type(s.index) in (int, str):
        base = _encode_source(s.base)
        return None if base is None else ["item", base, s.index]
    return None


def _encode_dynamism(dynamism):
    """What automatic dynamic saw change (dynamic.InputDynamism) as JSON; None when a source has no
    portable form."""
    dims = [[_encode_source(source), sorted(d)] for source, d in dynamism.changed_dims.items() if d]
    scalars = [_encode_source(source) for source in dynamism.changed_scalars]
    if any(enc is None for enc, _ in dims) or any(enc is None for enc in scalars):
        return None
    return {"dims": sorted(dims, key=json.dumps), "scalars": sorted(scalars, key=json.dumps)}


def _decode_source(enc):
    kind = enc[0]
    if kind == "L":
        return LocalSource(enc[1], enc[2])
    if kind == "G":
        return GlobalSource(None, enc[1], True)
    if kind == "cell":
        return CellSource(enc[1], enc[2])
    if kind == "attr":
        return AttrSource(_decode_source(enc[1]), enc[2])
    return ItemSource(_decode_source(enc[1]), enc[2])
