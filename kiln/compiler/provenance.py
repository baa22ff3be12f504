"""Where each buffer and kernel came from: the aten nodes and the user's lines.

Lowering records, for each buffer it makes, the aten node being lowered plus every node whose value
was still lazy (not realized) and so is computed inside that buffer (`origin_nodes`). A kernel's
origins are its buffers' origins; its name says what it computes (`kiln_fused_softmax_add_3`, from
the user-level ops capture recorded as `source_fn_stack`) and its code starts with a comment naming
its aten ops and user lines (`kernel_comment`).
"""
import re

import torch

from kiln.compiler import ir

MAX_NAME_OPS = 3  # ops named in a kernel's name; the comment names them all
# ops that move or relabel data: named in a kernel's name only when it computes nothing else
LAYOUT_OPS = {"view", "reshape", "_unsafe_view", "permute", "expand", "transpose", "t", "getitem", "alias",
              "unsqueeze", "squeeze", "contiguous", "clone", "slice", "select", "as_strided", "split", "to",
              "_to_copy", "flatten", "unflatten", "narrow", "type_as", "float", "dropout"}


def origin_nodes(node, env):
    """`node` and the lazy values it reads, transitively: the aten nodes a buffer made for `node`
    computes (in no particular order)."""
    if not isinstance(node, torch.fx.Node):
        return []
    out, stack, seen = [node], [node], {node}
    while stack:
        for arg in stack.pop().all_input_nodes:
            if arg in seen:
                continue
            seen.add(arg)
            value = env.get(arg)
            if isinstance(value, ir.TensorValue) and value.view is None:  # inlined into the reader
                out.append(arg)
                stack.append(arg)
    return out


def kernel_nodes(kernel, origins, order):
    """The aten nodes `kernel` computes, in graph order."""
    nodes = {n for loop_node in kernel.nodes for n in origins.get(loop_node.name, ())}
    return sorted(nodes, key=lambda n: order.get(n, 0))


def user_op(node):
    """The name of the op the user called that an aten node came from (softmax for its amax, exp,
    ...), else the aten op's own name."""
    stack = node.meta.get("source_fn_stack")
    if stack:
        target = stack[-1][1]
        name = target if isinstance(target, str) else getattr(target, "__name__", None)
        if name:
            return name.strip("_")
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def user_line(node):
    """`file:line in fn: code` of the innermost line in an aten node's stack_trace (where its op is
    written), or None."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n[ \t]*(.*)', trace)
    if not found:
        return trace.strip().splitlines()[-1]
    filename, line, fn, text = found[-1]
    return f"{filename}:{line} in {fn}: {text.strip()}"


def op_name(node):
    """`aten.add.Tensor` for an aten node; the function's name for others (getitem)."""
    return str(node.target) if isinstance(node.target, torch._ops.OpOverload) else \
        getattr(node.target, "__name__", str(node.target))


def kernel_name(nodes, index):
    """`kiln_fused_softmax_add_3`: the user-level ops, in order, and the kernel's position."""
    ops = [op for op in dict.fromkeys(re.sub(r"\W", "", user_op(n)) for n in nodes) if op]
    ops = ([op for op in ops if op not in LAYOUT_OPS] or ops)[:MAX_NAME_OPS]
    if not ops:
        return f"kiln_kernel_{index}"
    return f"kiln_{'fused_' if len(nodes) > 1 and len(ops) > 1 else ''}{'_'.join(ops)}_{index}"


def kernel_comment(nodes):
    """The lines of a kernel's leading comment: its aten ops and the user lines they came from."""
    aten = ", ".join(dict.fromkeys(map(op_name, nodes)))
    lines = [f"aten: {aten}"] if aten else []
    lines += [f"from {line}" for line in dict.fromkeys(filter(None, map(user_line, nodes)))]
    return [line.replace("*/", "* /").replace("\n", " ") for line in lines]


def name_kernels(kernels, origins, order):
    """Give each kernel its name and comment (schedule.Kernel.name, .provenance)."""
    for index, kernel in enumerate(kernels):
        nodes = kernel_nodes(kernel, origins, order)
        kernel.name = kernel_name(nodes, index)
        kernel.provenance = kernel_comment(nodes)


def kernel_origins(kernels, graph):
    """[(kernel, its aten nodes)] for the report."""
    return [(k, kernel_nodes(k, graph.origins, graph.node_order)) for k in kernels]


def kernel_sources(source, kernels):
    """{kernel name: its C++} cut from the translation unit `source`: from its leading comment to
    the brace that closes its block."""
    lines, out = source.splitlines(), {}
    for kernel in kernels:
        header = f"  // {kernel.name}:"
        start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
        if start is None:
            continue
        end = next((i for i in range(start + 1, len(lines)) if lines[i] == "  }"), len(lines) - 1)
        first = start - len(kernel.provenance)
        out[kernel.name] = "\n".join(lines[first:end + 1])
    return out
