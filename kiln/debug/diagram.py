"""Graphs drawn as SVG with graphviz (the `graphviz` package and its `dot` program), or None when
either is missing: a diagram is a nicety, never a reason to fail."""
import html
import re
import shutil

MAX_NODES = 1500  # larger graphs are not drawn (dot takes minutes, and nobody reads the picture)


def _digraph():
    try:
        import graphviz
    except ImportError:
        return None
    if shutil.which("dot") is None:
        return None
    g = graphviz.Digraph(graph_attr={"rankdir": "TB", "fontsize": "10"},
                         node_attr={"shape": "box", "fontsize": "10", "style": "rounded,filled",
                                    "fillcolor": "#eef3fb", "fontname": "Helvetica"})
    return g


def _svg(g):
    try:
        svg = g.pipe(format="svg").decode()
    except Exception:  # noqa: BLE001 (dot failed: no picture)
        return None
    return svg[svg.index("<svg"):] if "<svg" in svg else None


def short_source(source):
    """L['model']._modules['h']._modules['0']._parameters['bias'] -> model.h.0.bias"""
    text = re.sub(r"\._(modules|parameters|buffers)\['([^']+)'\]", r".\2", str(source))
    return re.sub(r"^[LG]\['([^']+)'\]", r"\1", text)


def fx_svg(gm):
    """The torch-level graph: one box per input, op and output, edges where values flow."""
    nodes = list(gm.graph.nodes)
    if len(nodes) > MAX_NODES:
        return None
    g = _digraph()
    if g is None:
        return None
    for n in nodes:
        if n.op == "placeholder":
            g.node(n.name, html.escape(short_source(n.meta.get("source", n.name))), fillcolor="#e8f5e9",
                   shape="ellipse")
        elif n.op == "output":
            g.node(n.name, "output", fillcolor="#fff3e0", shape="ellipse")
        else:
            target = getattr(n.target, "__name__", None) or str(n.target)
            g.node(n.name, html.escape(target if n.name.rstrip("_0123456789") == target else f"{n.name}\n{target}"))
        for arg in n.all_input_nodes:
            g.edge(arg.name, n.name)
    return _svg(g)


def schedule_svg(program):
    """The fused schedule: one box per kernel or extern call, edges where a buffer flows."""
    from kiln.compiler import ir
    from kiln.compiler.schedule import Kernel
    g = _digraph()
    if g is None:
        return None
    writer = {}
    for i, step in enumerate(program.steps):
        sid = f"s{i}"
        if isinstance(step, Kernel):
            g.node(sid, html.escape(f"{step.name}\n" + ", ".join(n.name for n in step.nodes)))
            made = [n.name for n in step.nodes]
            reads = {r for n in step.nodes for r in n.reads} - set(made)
        else:
            g.node(sid, html.escape(f"{step.name}\n{step.target}"), fillcolor="#fdecea")
            made = [b for b in _leaves(step.outputs) if b]
            reads = {a.name for a in _leaves((step.args, step.kwargs)) if isinstance(a, ir.BufferArg)}
        for name in sorted(reads):
            if name in writer:
                g.edge(writer[name], sid, label=name)
            else:
                g.node(name, name, shape="ellipse", fillcolor="#e8f5e9")
                g.edge(name, sid)
        writer.update({m: sid for m in made})
    return _svg(g)


def _leaves(tree):
    import torch.utils._pytree as pytree
    return pytree.tree_leaves(tree)
