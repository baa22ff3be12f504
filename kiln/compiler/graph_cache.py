"""Compiled graphs on disk: a fresh process that meets a graph it compiled before skips aot,
lowering, scheduling and codegen.

`lookup(gm, example_inputs, options)` computes the graph's key and, on a hit, rebuilds the runner;
on a miss, `Lookup.store(aten, flat_fn)` records the compiled graph after `compile_fx` made it.

- key: sha256 over everything the compiled graph depends on: the fx graph (each node's op, target by
  qualified name and literal arguments: what aot traces, not the code torch.fx generates from them), the example inputs' metadata (type, dtype,
  shape, stride, storage offset, requires_grad, which ones share storage), the metadata of the
  parameters and buffers it reads, the compiler options, the global modes compilation reads
  (threads, default dtype, grad and inference mode), torch's and Python's versions and a hash of
  kiln's compiler sources. The C++ compiler's identity is in build.py's key for the library.
- value (`graphs/<key[:2]>/<key>.json`): the library's C++ source and build flags (build.py's cache
  gives back the .so), the wrapper's Python source and a description of each global it uses (aten
  ops by qualified name, native entries by symbol, module tensors by their attribute path in the fx
  graph, so a loaded graph reads the current parameters; baked constant tensors by value), and aot's
  runner metadata (outputs, mutated inputs and module tensors, aliased outputs, the output tree).
- entries are JSON with a sha256 line in front, written atomically into the private cache directory;
  a missing, damaged, unreadable or unloadable entry is a miss (a damaged one warns once and is
  rewritten), never trusted and never an error.
- not cached (logged under KILN_LOGS=perf_hints): graphs with symbolic sizes, training graphs
  (compile_fx never asks), graphs with submodule calls or non-library targets, graphs that fall back
  to aten as a whole, and any graph whose wrapper holds a value this module cannot describe.
"""
import base64
import ctypes
import dataclasses
import functools
import hashlib
import importlib
import io
import json
import operator
import sys
import types

import torch
import torch._guards
import torch.utils._pytree as pytree

from kiln import sources_digest
from kiln.compiler import build, native_calls
from kiln.debug.logs import log

FORMAT = 2  # 2: runner metadata holds output_views
_LIBRARY_MODULES = ("torch", "operator", "_operator", "math", "builtins")  # graph targets we can name
_WRAPPER_MODULES = _LIBRARY_MODULES + ("ctypes", "kiln")                     # ... and wrapper globals
_LITERALS = (type(None), bool, int, float, str)


@dataclasses.dataclass
class GraphCacheStats:
    """How `lookup` calls were answered in this process (for tests: a hit skips aot)."""
    hits: int = 0
    misses: int = 0
    stores: int = 0
    uncacheable: int = 0


stats = GraphCacheStats()


class Uncacheable(Exception):
    """Something in the graph or its compiled form cannot be described safely: do not cache it."""


@dataclasses.dataclass
class Lookup:
    key: str | None                 # None: the cache is off for this graph
    runner: object = None           # the loaded graph on a hit
    gm: object = None
    example_inputs: list = None
    guards_before: int = 0          # the ShapeEnv's guards when the compile began

    def store(self, aten, flat_fn):
        """Record the graph `compile_fx` just compiled (aten: aot.AtenGraph; flat_fn: compile_aten's)."""
        if self.key is None:
            return
        try:
            check_no_new_guards(self)
            entry = _describe(self, aten, flat_fn)
        except Uncacheable as e:
            stats.uncacheable += 1
            log("perf_hints", "graph not kept in the graph cache: %s", e)
            return
        try:
            check_plain(entry)
        except Uncacheable as e:
            stats.uncacheable += 1
            log("perf_hints", "graph not kept in the graph cache: %s", e)
            return
        try:
            build._write_atomically(_entry_path(self.key), _seal(entry))
        except OSError as e:  # a full disk costs the next process a compile, not this one its graph
            log("perf_hints", "graph cache entry not written (%s)", e)
            return
        stats.stores += 1


_OFF = Lookup(None)


def lookup(gm, example_inputs, options):
    """The cached runner for `gm` compiled for `example_inputs` (Lookup.runner), or a Lookup to store into."""
    if not enabled(options):
        return _OFF
    try:
        key = graph_key(gm, example_inputs, options)
    except Uncacheable as e:
        stats.uncacheable += 1
        log("perf_hints", "graph not kept in the graph cache: %s", e)
        return _OFF
    found = Lookup(key, None, gm, list(example_inputs), guard_count(gm))
    entry = _read(key)
    if entry is not None:
        try:
            found.runner = _load(entry, gm, example_inputs, options)
        except Exception as e:  # a stale description (an op gone, a symbol missing): compile afresh
            log("perf_hints", "graph cache entry %s could not be loaded (%s: %s): compiling again",
                key[:16], type(e).__name__, e)
    if found.runner is None:
        stats.misses += 1
    else:
        stats.hits += 1
        log("output_code", "graph loaded from the graph cache (%s)", key[:16])
    return found


def enabled(options):
    """Whether compiled graphs are kept on disk under these compiler options (a trace or the debug
    checks want the compile itself)."""
    return options.get("graph_cache", True) and not options.get("trace.enabled") and not options.get("debug")


# ---- the key ------------------------------------------------------------------------------------
def graph_key(gm, example_inputs, options):
    module_tensors = _module_tensors(gm)
    symbolic = symbolic_inputs(gm)
    parts = {
        "format": FORMAT,
        "versions": [torch.__version__, list(sys.version_info[:2]), sources_digest.digest("compiler")],
        "modes": _global_modes(),
        "options": [[k, _literal(v, f"option {k}")] for k, v in sorted(options.items())],
        "codegen": _codegen(gm),
        "nodes": [_node_key(gm, node, module_tensors, symbolic is not None) for node in gm.graph.nodes],
        "inputs": _inputs_key(list(example_inputs), module_tensors, symbolic),
    }
    if symbolic is not None:  # the compiled code may rely on any fact the guards proved about the sizes
        parts["size_facts"] = size_facts(gm)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _codegen(gm):
    """How the graph's code calls it. The key holds the graph's nodes, not the code torch.fx generates
    from them: the compiler compiles the graph (aot runs it node by node), and generating the code
    would cost a warm process more than the rest of the key (a graph rebuilt from disk makes its code
    only when something runs it)."""
    codegen = type(gm.graph._codegen)
    if codegen is not torch.fx.graph.CodeGen:  # (a pytree codegen flattens the call's arguments)
        raise Uncacheable(f"the graph's code is generated by {codegen.__name__}")
    return codegen.__name__


# ---- graphs with symbolic sizes -------------------------------------------------------------------
# Their key holds each placeholder's symbolic description (sizes and strides as expressions over s0,
# s1, ...) instead of the example inputs' sizes, and what the ShapeEnv knew when the graph was handed
# over (guards, ranges, replacements). Capture records both on the graph (placeholder meta
# "kiln_input", gm.meta "kiln_size_facts") when it stores a frame, so a process that rebuilds the
# graph from disk, without fake tensors or a ShapeEnv, computes the same key.
def symbolic_inputs(gm):
    """Each placeholder's description when any has symbolic sizes (or came from disk with them); None
    for a static graph."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    stored = [p.meta.get("kiln_input") for p in placeholders]
    if all(d is not None for d in stored) and stored:
        return stored
    values = [p.meta.get("example_value") for p in placeholders]
    if not any(_is_symbolic(v) for v in values):
        return None
    return [describe_input(v) for v in values]


def describe_input(value):
    """A placeholder's fake value as JSON-able lists of strings: symbolic sizes by expression."""
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided or type(value).__name__ not in ("FakeTensor", "Tensor", "Parameter"):
            raise Uncacheable(f"a graph input is a {type(value).__name__} ({value.layout})")
        return ["tensor", str(value.dtype), str(value.device), [str(s) for s in value.shape],
                [str(s) for s in value.stride()], str(value.storage_offset()), bool(value.requires_grad)]
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return [type(value).__name__, str(value.node.expr)]
    if isinstance(value, (bool, int)):
        return ["value", value]
    raise Uncacheable(f"a graph input is a {type(value).__name__}")


def size_facts(gm):
    """What the graph's ShapeEnv knew about its sizes, as sorted text (recorded on gm.meta the first
    time, so a later compile that adds guards does not change the graph's key)."""
    facts = gm.meta.get("kiln_size_facts")
    if facts is None:
        env = _shape_env(gm)
        if env is None:
            raise Uncacheable("a graph with symbolic sizes has no ShapeEnv")
        facts = gm.meta["kiln_size_facts"] = [
            sorted(str(g.expr) for g in env.guards),
            sorted(f"{k}: {v}" for k, v in env.var_to_range.items()),
            sorted(f"{k} = {v}" for k, v in env.replacements.items()),
            sorted(str(k) for k in env.divisible)]
    return facts


def guard_count(gm):
    env = _shape_env(gm) if symbolic_inputs(gm) is not None else None
    return 0 if env is None else len(env.guards)


def check_no_new_guards(lookup):
    """A compile that proved more about the sizes (a size is 1, a dim is contiguous) made code that
    holds only under those guards, which the key (the facts before the compile) does not hold: a
    later capture of the same graph without them would load code specialized for another size
    (Hugging Face JetMoE's expert split by a size that was 1 once: wrong rows, NaN)."""
    if symbolic_inputs(lookup.gm) is None:
        return
    env = _shape_env(lookup.gm)
    if env is not None and len(env.guards) > lookup.guards_before:
        raise Uncacheable(f"compiling it added {len(env.guards) - lookup.guards_before} guard(s) on its sizes")


def _shape_env(gm):
    for p in gm.graph.find_nodes(op="placeholder"):
        value = p.meta.get("example_value")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return value.node.shape_env
        env = getattr(getattr(value, "fake_mode", None), "shape_env", None)
        if env is not None and _is_symbolic(value):
            return env
    return None


def needs_a_hit(gm):
    """Whether `gm` came from disk with symbolic sizes: it has no fake values to trace with, so only a
    compiled graph from the cache may serve it (a compile would specialize it to the call's sizes)."""
    return bool(gm.meta.get("kiln_from_disk_symbolic"))


class NotCached(Exception):
    """A graph from disk with symbolic sizes whose compiled form is not in the cache."""


def _global_modes():
    """Process-wide settings that tracing or codegen reads (autocast changes the aten graph,
    the thread count is baked into the kernels)."""
    return [torch.get_num_threads(), str(torch.get_default_dtype()), torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(), torch.are_deterministic_algorithms_enabled(),
            [[torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d))] for d in ("cpu", "cuda")]]


def _module_tensors(gm):
    """{id(tensor): qualified name} of the parameters and buffers of `gm` (all names, shared ones too)."""
    named = {}
    for name, t in (*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)):
        named.setdefault(id(t), name)
    return named


def _node_key(gm, node, module_tensors, symbolic):
    if node.op == "call_module":
        raise Uncacheable(f"node {node.name} calls submodule {node.target!r}")
    if node.op == "get_attr":
        value = operator.attrgetter(node.target)(gm)
        if not isinstance(value, torch.Tensor) or id(value) not in module_tensors:
            raise Uncacheable(f"node {node.name} reads {node.target!r}, not a parameter or buffer")
        target = [node.target, _tensor_meta(value)]
    elif node.op == "call_function":
        target = _callable_name(node.target, _LIBRARY_MODULES)
    else:
        target = node.target  # placeholder/output names, method names
    if not symbolic and "example_value" in node.meta and _is_symbolic(node.meta["example_value"]):
        raise Uncacheable("the graph has sizes read from tensor data")
    return [node.op, node.name, target, _literal((node.args, node.kwargs), f"an argument of {node.name}")]


def check_plain(value, where="the entry"):
    """Uncacheable unless `value` is JSON made of plain values (no SymInt or sympy expression hiding
    in the runner's metadata or the kernels' descriptions: they would not mean the same on load)."""
    if isinstance(value, dict):
        for k, v in value.items():
            check_plain(v, k)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_plain(v, where)
    elif not (value is None or type(value) in (bool, int, str) or type(value) is float):
        raise Uncacheable(f"{where} holds a {type(value).__name__}")


def _literal(value, what):
    """A JSON-able form of a node argument or option; Uncacheable for anything else."""
    if isinstance(value, float):
        return ["float", repr(value)]  # nan, inf and -0.0 kept apart
    if isinstance(value, _LITERALS):
        return value
    if isinstance(value, torch.fx.Node):
        return ["node", value.name]
    if isinstance(value, (tuple, list, torch.Size)):
        return [type(value).__name__, [_literal(v, what) for v in value]]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return ["dict", [[k, _literal(v, what)] for k, v in value.items()]]
    if isinstance(value, slice):
        return ["slice", _literal((value.start, value.stop, value.step), what)]
    if value is Ellipsis:
        return ["..."]
    if isinstance(value, complex):
        return ["complex", repr(value)]
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format, torch.device)):
        return [type(value).__name__, str(value)]
    raise Uncacheable(f"{what} is a {type(value).__name__}")


def _inputs_key(example_inputs, module_tensors, symbolic):
    """The inputs' metadata; with symbolic sizes, their descriptions and what is not in them."""
    if symbolic is not None and len(symbolic) != len(example_inputs):
        raise Uncacheable("the example inputs do not match the graph's placeholders")
    owners = {}  # storage -> first input sharing it: aliasing decides what aot may do
    out = []
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            if _is_symbolic(x) or x.layout is not torch.strided or type(x) not in (torch.Tensor, torch.nn.Parameter):
                raise Uncacheable(f"input {i} is a {type(x).__name__} ({x.layout})")
            shares = owners.setdefault(x.untyped_storage().data_ptr(), i)
            meta = _tensor_meta(x) if symbolic is None else symbolic[i]
            out.append(["tensor", type(x).__name__, meta, shares, x.is_conj(), x.is_neg()])
        elif symbolic is not None:
            out.append(["scalar", symbolic[i]])
        elif isinstance(x, (bool, int, float)) and not isinstance(x, torch.SymInt):
            out.append(["scalar", _literal(x, f"input {i}")])
        else:
            raise Uncacheable(f"input {i} is a {type(x).__name__}")
    return out


def _tensor_meta(t):
    return [str(t.dtype), str(t.device), list(t.shape), list(t.stride()), t.storage_offset(), t.requires_grad]


def _is_symbolic(value):
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride(), value.storage_offset()))
    return False


def _callable_name(fn, allowed_roots):
    """[module, qualified name] that imports back to `fn` itself; Uncacheable when there is none."""
    if isinstance(fn, torch._ops.OpOverload):
        return ["op", fn.name()]
    owner = getattr(fn, "__objclass__", None)  # a method descriptor: torch.Tensor.add
    if owner is not None and getattr(fn, "__module__", None) is None:
        module, path = owner.__module__, f"{owner.__qualname__}.{fn.__name__}"
    else:
        module, path = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    candidates = [(module, path), (module, getattr(fn, "__name__", None))]
    for module, path in candidates:
        if module and path and module.split(".")[0] in allowed_roots and _resolve(module, path) is fn:
            return [module, path]
    raise Uncacheable(f"{fn!r} cannot be named by module and qualified name")


def _resolve(module, path):
    try:
        return operator.attrgetter(path)(importlib.import_module(module))
    except (ImportError, AttributeError):
        return None


# ---- describing a compiled graph ------------------------------------------------------------------
def _describe(found, aten, flat_fn):
    module_tensors = _module_tensors(found.gm)
    return {
        "format": FORMAT, "key": found.key,
        **describe_compiled(flat_fn, module_tensors, input_storages(found.gm, found.example_inputs)),
        "runner": _runner_metadata(aten, module_tensors),
    }


def describe_compiled(flat_fn, module_tensors, storages):
    """The JSON-able form of a compiled aten graph (compile_aten's callable): its library's build
    recipe, its wrapper's source and each global the wrapper reads. `module_tensors`: {id: attribute
    path} of the tensors read through the fx graph; `storages`: the input tensors' storages, which no
    baked constant may share. Uncacheable when any of it cannot be described."""
    wrapper_source = getattr(flat_fn, "kiln_wrapper", "")
    if not wrapper_source or "<whole graph>" in flat_fn.kiln_fallbacks or \
            getattr(flat_fn, "__code__", None) is None or flat_fn.__code__.co_name != "kiln_graph":
        raise Uncacheable("the graph runs through aten as a whole")
    code = flat_fn.__code__
    if flat_fn.__closure__ or _compiled_wrapper(wrapper_source).co_code != code.co_code:
        raise Uncacheable("the wrapper function is not its source alone")
    library = None
    described = {}
    for name in sorted(_global_names(code)):
        if name not in flat_fn.__globals__:
            continue  # a builtin
        value = flat_fn.__globals__[name]
        desc = _describe_value(value, name, module_tensors, storages)
        _check_round_trip(desc, value, name)
        if desc[0] in ("entry", "native_entry"):
            library = _same_library(library, native_calls.entry_of(value) or value, name)
        described[name] = desc
    return {
        "library": library,
        "wrapper": wrapper_source,
        "globals": described,
        "inspect": {"kernels": [dataclasses.asdict(k) for k in flat_fn.kiln_kernels],
                    "fallbacks": list(flat_fn.kiln_fallbacks)},
    }


@functools.lru_cache(maxsize=256)
def _compiled_wrapper(source):
    module = compile(source, "<kiln wrapper>", "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == "kiln_graph")


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def input_storages(gm, example_inputs):
    """The storages of the graph's parameters, buffers and tensor inputs (data pointers)."""
    return {t.untyped_storage().data_ptr()
            for t in (*gm.parameters(), *gm.buffers(), *(x for x in example_inputs if isinstance(x, torch.Tensor)))}


def _describe_value(value, name, module_tensors, storages):
    if isinstance(value, torch.Tensor):
        return _describe_tensor(value, name, module_tensors, storages)
    if (entry := native_calls.entry_of(value)) is not None:  # a native caller: its entry, made again on load
        return ["native_entry", *_describe_value(entry, name, module_tensors, storages)[1:]]
    if isinstance(value, ctypes._CFuncPtr):
        if value.restype is not None or not all(t in (ctypes.c_void_p, ctypes.c_int64) for t in value.argtypes or ()):
            raise Uncacheable(f"native entry {name} has a signature the cache does not know")
        return ["entry", value.__name__, [t.__name__ for t in value.argtypes]]
    if isinstance(value, types.ModuleType):
        if value.__name__.split(".")[0] not in _WRAPPER_MODULES or sys.modules.get(value.__name__) is not value:
            raise Uncacheable(f"wrapper global {name} is module {value.__name__}")
        return ["module", value.__name__]
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format, torch.device)):
        desc = describe_torch_constant(value)
        if desc is None:
            raise Uncacheable(f"wrapper global {name} is {value!r}")
        return desc
    if isinstance(value, _LITERALS) or isinstance(value, tuple) and all(isinstance(v, _LITERALS) for v in value):
        if isinstance(value, float) or isinstance(value, tuple) and any(isinstance(v, float) for v in value):
            raise Uncacheable(f"wrapper global {name} is a float constant")  # JSON would round nan/-0.0 oddly
        return ["value", value]
    if isinstance(value, torch._ops.OpOverload):
        return ["op", value.name()]
    if callable(value):
        return ["object", *_callable_name(value, _WRAPPER_MODULES)]
    raise Uncacheable(f"wrapper global {name} is a {type(value).__name__}")


def _check_round_trip(desc, value, name):
    """A described global must load back as the very object (or an equal value) the wrapper holds."""
    if desc[0] in ("module_tensor", "tensor", "entry", "native_entry"):
        return  # resolved against the module / checked by library_recipe / saved by value
    try:
        back = _rebuild(desc, None, None)
    except Exception:
        back = None
    if not (back is value or desc[0] in ("device", "value") and back == value):
        raise Uncacheable(f"wrapper global {name} ({desc[0]}) does not load back as itself")


def _describe_tensor(t, name, module_tensors, storages):
    if id(t) in module_tensors:  # read through the fx graph on load: the current parameter object
        return ["module_tensor", module_tensors[id(t)]]
    if t.requires_grad or type(t) is not torch.Tensor or t.layout is not torch.strided or \
            t.untyped_storage().data_ptr() in storages:
        raise Uncacheable(f"wrapper global {name} is a tensor that is neither a module tensor nor a constant")
    buffer = io.BytesIO()
    torch.save(t, buffer)  # keeps size, stride and offset
    return ["tensor", base64.b64encode(buffer.getvalue()).decode()]


def _same_library(library, fn, name):
    """The build recipe of the library holding native entry `fn`; one library per graph."""
    recipe = build.library_recipe(fn)
    if recipe is None:
        raise Uncacheable(f"native entry {name} is not from a library kiln built in this process")
    source, name_hint, flags = recipe
    found = {"source": source, "name_hint": name_hint, "flags": list(flags)}
    if library is not None and library != found:
        raise Uncacheable("the wrapper calls into two libraries")
    return found


def _runner_metadata(aten, module_tensors):
    try:
        out_spec = pytree.treespec_dumps(aten.out_spec)
    except Exception as e:  # a container type pytree cannot serialize (a namedtuple, a custom class)
        raise Uncacheable(f"the output structure cannot be saved ({type(e).__name__}: {e})") from None
    mutated_attrs = []
    for t in aten.mutated_attrs:
        if id(t) not in module_tensors:
            raise Uncacheable("a mutated module tensor has no attribute path")
        mutated_attrs.append(module_tensors[id(t)])
    return {"num_user_outputs": aten.num_user_outputs, "mutated_inputs": list(aten.mutated_inputs),
            "out_spec": out_spec, "mutated_attrs": mutated_attrs,
            "output_aliases": [[a.output_index, a.input_index, a.view] for a in aten.output_aliases],
            "output_views": [[v.output_index, v.base_index, v.view, v.base_layout] for v in aten.output_views]}


# ---- loading --------------------------------------------------------------------------------------
def _load(entry, gm, example_inputs, options):
    from kiln.compiler import runner as graph_runner

    flat_fn = load_compiled(entry, gm)
    meta = entry["runner"]
    aten = graph_runner.AtenGraph(
        gm=None, num_user_outputs=meta["num_user_outputs"], mutated_inputs=meta["mutated_inputs"],
        out_spec=pytree.treespec_loads(meta["out_spec"]),
        mutated_attrs=[operator.attrgetter(path)(gm) for path in meta["mutated_attrs"]],
        output_aliases=[graph_runner.OutputAlias(k, i, None if view is None else (tuple(view[0]), tuple(view[1]), view[2]))
                        for k, i, view in meta["output_aliases"]],
        output_views=[graph_runner.OutputView(k, base, tuples(view), tuples(base_layout))
                      for k, base, view, base_layout in meta["output_views"]])
    runner = graph_runner.make_runner(aten, flat_fn)
    runner.kiln_aten = _AtenOnDemand(gm, [_placeholder_like(x) for x in example_inputs], options)
    return runner


def load_compiled(entry, gm):
    """The callable `describe_compiled` described (module tensors read from `gm`)."""
    from kiln.compiler.debug import KernelInfo, log_output_code

    library = entry["library"]
    lib = build.load_library(library["source"], name_hint=library["name_hint"],
                             extra_flags=tuple(library["flags"])) if library else None
    scope = {name: _rebuild(desc, gm, lib) for name, desc in entry["globals"].items()}
    exec(compile(entry["wrapper"], "<kiln wrapper>", "exec"), scope)
    flat_fn = scope["kiln_graph"]
    flat_fn.kiln_kernels = [KernelInfo(**{k: tuple(v) if isinstance(v, list) else v for k, v in info.items()})
                            for info in entry["inspect"]["kernels"]]
    flat_fn.kiln_source = library["source"] if library else ""
    flat_fn.kiln_wrapper = entry["wrapper"]
    flat_fn.kiln_fallbacks = list(entry["inspect"]["fallbacks"])
    log_output_code(getattr(lib, "_name", None), flat_fn.kiln_source, flat_fn.kiln_wrapper)
    return flat_fn


def tuples(value):
    """JSON lists back to the nested tuples aot's layouts are."""
    return tuple(tuples(v) for v in value) if isinstance(value, list) else value


def _rebuild(desc, gm, lib):
    kind, *rest = desc
    if kind == "module_tensor":
        return operator.attrgetter(rest[0])(gm)
    if kind == "tensor":
        # outside any TracingContext: torch.load makes meta tensors when it finds a fake mode there,
        # and a user backend that wraps compile_fx runs inside capture's (user_backends.py)
        with torch._guards.tracing(None):
            return torch.load(io.BytesIO(base64.b64decode(rest[0])), weights_only=True)
    if kind in ("entry", "native_entry"):
        fn = getattr(lib, rest[0])
        fn.argtypes = [getattr(ctypes, t) for t in rest[1]]
        fn.restype = None
        if kind == "entry":
            return fn
        native = native_calls.caller(fn, len(fn.argtypes))
        if native is None:  # (the wrapper passes tensors: it needs the native caller)
            raise LookupError(f"native entry calls are not available here for {rest[0]}")
        return native
    if kind == "module":
        return importlib.import_module(rest[0])
    if kind == "torch":
        return getattr(torch, rest[0])
    if kind == "device":
        return torch.device(rest[0])
    if kind == "value":
        return tuple(rest[0]) if isinstance(rest[0], list) else rest[0]
    if kind == "object":
        value = _resolve(*rest)
        if value is None:
            raise LookupError(f"{'.'.join(rest)} no longer exists")
        return value
    if kind == "op":
        return op_named(rest[0])
    raise ValueError(f"unknown global kind {kind!r}")


def describe_torch_constant(value):
    """["torch", name] for a dtype, layout or memory format torch has under that name; ["device",
    text] for a device; None for anything else (shared with the capture cache)."""
    if isinstance(value, torch.device):
        return ["device", str(value)]
    attr = str(value).removeprefix("torch.")
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)) and getattr(torch, attr, None) is value:
        return ["torch", attr]
    return None


def op_named(name):
    """The OpOverload `name` ("aten::add.Tensor") names; AttributeError when torch has none."""
    namespace, _, name = name.partition("::")
    packet, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _placeholder_like(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
    return x


class _AtenOnDemand:
    """`kiln_aten` of a graph loaded from the cache: aot runs again the first time it is inspected
    (on inputs of the same metadata, fresh memory: aliasing between inputs is not reproduced)."""

    def __init__(self, gm, example_inputs, options):
        self._args, self._aten = (gm, example_inputs, options), None

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._aten is None:
            from kiln.compiler import aot
            gm, example_inputs, options = self._args
            self._aten = aot.trace_aten(gm, example_inputs,
                                        aot.lowering_decompositions(options.get("fallback_random", False)))
        return getattr(self._aten, name)


# ---- entries on disk ------------------------------------------------------------------------------
def _entry_path(key):
    return build.cache_subdir("graphs", key[:2]) / f"{key}.json"


def _seal(entry):
    return build.seal(entry)


def _read(key):
    """The entry stored under `key`, or None when there is none or it is damaged (any failure to
    read or parse it is a miss, with one warning, never an error)."""
    return build.read_sealed(_entry_path(key), lambda entry: entry.get("format") == FORMAT and entry.get("key") == key)
