"""Shared test helpers: a counting backend and eager-vs-compiled comparison."""
import copy

import torch


class CompileCounter:
    """A backend that counts graphs and ops, keeps each graph, and runs it as captured."""

    def __init__(self):
        self.frame_count = 0   # graphs handed to the backend
        self.op_count = 0      # call_* nodes across those graphs
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        self.graphs.append(gm)
        self.op_count += sum(n.op.startswith("call") for n in gm.graph.nodes)
        return gm.forward

    def clear(self):
        self.frame_count = self.op_count = 0
        self.graphs.clear()


def clone_args(args):
    """Deep copies of the arguments (tensors cloned, requires_grad kept) so eager and compiled runs
    see equal but independent inputs."""
    def one(a):
        if isinstance(a, torch.Tensor):
            c = a.detach().clone()
            c.requires_grad_(a.requires_grad)
            return c
        return copy.deepcopy(a)
    return [one(a) for a in args]


def assert_same(fn, compiled, *args, rtol=1e-5, atol=1e-6):
    """Run fn and compiled on equal copies of args; results and the args after the call must match."""
    eager_args, compiled_args = clone_args(args), clone_args(args)
    expected = fn(*eager_args)
    actual = compiled(*compiled_args)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    for e, c in zip(eager_args, compiled_args):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(c, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert c == e
    return actual
