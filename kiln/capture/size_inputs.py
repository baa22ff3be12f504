"""Symbolic sizes as inputs of their own, in the graph a user backend gets (as torch.compile gives it).

kiln's graph reads a dynamic size where it needs one (`l_x.size()[0] // 2`). A backend that traces
that graph on the real example tensors (make_fx in "real" mode, a tracer of its own) then reads the
example's size, 4, and bakes it in: kiln's entry, valid for every size, would run code made for 4
(a stale answer). torch.compile hands a backend each size symbol as an input (a SymInt example) and
the graph computes every size from those inputs; a tracer that needs the number guards on the
symbol (kiln's ShapeEnv then recompiles for another size) or refuses, never bakes it silently.

`lift(gm, example_inputs)` makes that graph: one placeholder per symbol of the tensor inputs'
sizes, strides and storage offsets, first; every number-valued node (a size query, arithmetic on
sizes) replaced by the expression of its value over those placeholders and the number inputs.
The wrapper it returns computes the sizes from the tensors kiln passes at run time.
"""
import operator

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy.interp import sympy_interp
from torch.utils._sympy.reference import PythonReferenceAnalysis

from kiln.debug.logs import log

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_QUERIES = ("size", "stride", "numel", "dim", "storage_offset")


class CannotLift(Exception):
    pass


def lift(gm, example_inputs):
    """-> (graph module, example inputs, wrap) for a user backend, or None when no tensor input has
    a symbolic size. `wrap(compiled)` is the callable kiln's glue calls (with the original inputs)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(example_inputs):
        return None
    numbers = {_symbol(p.meta.get("example_value")): i for i, p in enumerate(placeholders)
               if _symbol(p.meta.get("example_value")) is not None}
    reads = _size_reads(placeholders, numbers)
    if not reads:
        return None
    try:
        lifted, examples = _lifted_graph(gm, reads, numbers)
    except Exception as e:  # noqa: BLE001 -- CannotLift, or an expression the printer cannot build
        log("dynamic", "sizes stay read inside the graph a user backend gets: %s: %s", type(e).__name__, e)
        return None  # (the graph as it was: a backend that bakes a size in still may, as before)
    getters = [(i, kind, d) for i, kind, d, _ in reads.values()]

    def wrap(compiled):
        def run(*args):
            return compiled(*[_read(args[i], kind, d) for i, kind, d in getters], *args)
        return run
    return lifted, examples + list(example_inputs), wrap


def _symbol(value):
    if isinstance(value, _SYMBOLIC) and isinstance(value.node.expr, sympy.Symbol):
        return value.node.expr
    return None


def _size_reads(placeholders, numbers):
    """symbol -> (input index, "size"/"stride"/"storage_offset", dim, the SymInt) for each symbol of
    a tensor input's layout that no number input already is."""
    reads = {}
    for i, p in enumerate(placeholders):
        fake = p.meta.get("example_value")
        if not isinstance(fake, torch.Tensor):
            continue
        for kind, values in (("size", fake.shape), ("stride", fake.stride()), ("storage_offset", [fake.storage_offset()])):
            for d, s in enumerate(values):
                sym = _symbol(s)
                if sym is not None and sym not in numbers and sym not in reads:
                    reads[sym] = (i, kind, d, s)
    return reads


def _read(t, kind, d):
    return t.storage_offset() if kind == "storage_offset" else getattr(t, kind)(d)


def _lifted_graph(gm, reads, numbers):
    graph = torch.fx.Graph()
    env = {}
    first = None
    for sym, (_, _, _, example) in reads.items():
        node = graph.placeholder(f"s_{sym}")
        node.meta["example_value"] = example
        env[sym] = node
        first = first or node
    copied = {}
    out = graph.graph_copy(gm.graph, copied)
    graph.output(out)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    for sym, i in numbers.items():
        env[sym] = copied[placeholders[i]]
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    proxies = {sym: torch.fx.Proxy(node, tracer) for sym, node in env.items()}
    replaced = []
    for node in list(graph.nodes):
        if node.op in ("placeholder", "output") or node in env.values():
            continue
        value = node.meta.get("example_value")
        if not _is_size_value(value):
            continue
        with graph.inserting_before(node):
            new = _materialize(value, proxies)
        node.replace_all_uses_with(new)
        replaced.append(node)
    _erase_dead_queries(graph, replaced)
    graph.lint()
    return torch.fx.GraphModule(gm, graph), [example for _, _, _, example in reads.values()]


def _is_size_value(value):
    """A number (or tuple of numbers) that depends on sizes, not on tensor data."""
    if isinstance(value, _SYMBOLIC):
        return bool(value.node.expr.free_symbols) and not free_unbacked_symbols(value)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, torch.SymInt)) for v in value):
        return any(_is_size_value(v) for v in value) and not free_unbacked_symbols(value)
    return False


def _materialize(value, proxies):
    """A node computing `value` from the size and number placeholders."""
    if isinstance(value, (tuple, list)):
        items = [_materialize(v, proxies) if _is_size_value(v) else int(v) for v in value]
        graph = next(iter(proxies.values())).node.graph
        node = graph.call_function(torch.Size, (tuple(items),))
        node.meta["kiln_size_expr"] = True
        return node
    expr = value.node.expr
    if expr.free_symbols - set(proxies):
        raise CannotLift(f"{expr} uses a symbol no input carries")
    result = sympy_interp(PythonReferenceAnalysis, proxies, expr)
    if not isinstance(result, torch.fx.Proxy):
        raise CannotLift(f"{expr} did not become a node")
    if result.node.op != "placeholder":  # (a bare symbol is its input itself)
        result.node.meta["example_value"] = value
        result.node.meta["kiln_size_expr"] = True
    return result.node


def _erase_dead_queries(graph, replaced):
    """The replaced nodes and the size queries feeding only them, now unused (never a tensor op:
    an in-place op with no user still writes)."""
    dead = set(replaced)
    for node in reversed(list(graph.nodes)):
        if node.users or node.op == "placeholder":
            continue
        if node in dead or node.meta.get("kiln_size_expr") or (node.op == "call_method" and node.target in _QUERIES) or \
                (node.op == "call_function" and node.target is operator.getitem and _is_size_value(
                    node.meta.get("example_value"))):
            graph.erase_node(node)
