"""Closing a subgraph: turn ops recorded into their own fx.Graph into a self-contained GraphModule.

While capture records a subgraph (an autograd.Function's forward or backward, see
OutputGraph.subgraph), its ops may read nodes of the graphs around it: a parameter the forward closes
over, a size computed before the call, a forward value the backward uses. `close` copies the
subgraph into a new graph whose inputs are its own placeholders followed by one placeholder per
such outside node ("lifted"), and says which outside nodes those are, so the caller can pass them in.
"""
import dataclasses

import torch
import torch.fx

from kiln.capture.variables import SymNodeVariable, TensorVariable


@dataclasses.dataclass
class Closed:
    gm: torch.fx.GraphModule
    lifted: list    # the outside nodes the graph reads, in the order of its extra placeholders


def close(raw, own_inputs, outputs, name):
    """`raw`: the recorded fx.Graph; `own_inputs`: its placeholders, in call order; `outputs`: a list of
    nodes (of `raw` or outside it) or None. Returns a GraphModule (*own_inputs, *lifted) -> tuple."""
    inside = set(raw.nodes)
    lifted = []
    for node in raw.nodes:
        for used in node.all_input_nodes:
            if used not in inside and used not in lifted:
                lifted.append(used)
    for out in outputs:
        if out is not None and out not in inside and out not in lifted:
            lifted.append(out)
    graph = torch.fx.Graph()
    copies = {}
    for node in own_inputs:
        copies[node] = graph.node_copy(node)
    for node in lifted:
        copies[node] = graph.placeholder(f"lifted_{node.name}")
        copies[node].meta["example_value"] = node.meta.get("example_value")
    for node in raw.nodes:
        if node.op != "placeholder":
            copies[node] = graph.node_copy(node, lambda n: copies[n])
    graph.output(tuple(None if out is None else copies[out] for out in outputs))
    return Closed(torch.fx.GraphModule(torch.nn.Module(), graph, class_name=name), lifted)


def outside_variable(node):
    """The Variable for a lifted node, passed to the call of the closed graph."""
    value = node.meta["example_value"]
    if isinstance(value, torch.Tensor):
        return TensorVariable(node, value)
    return SymNodeVariable(node, value)
