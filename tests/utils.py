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
    assert_equal_state(actual, expected, rtol, atol)
    for e, c in zip(eager_args, compiled_args):
        assert_equal_state(c, e, rtol, atol)
    return actual


def assert_equal_state(actual, expected, rtol=1e-5, atol=1e-6):
    """Recursive equality for Python state that may hold tensors (lists, dicts, tuples, objects)."""
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
        assert actual.requires_grad == expected.requires_grad, "requires_grad differs from eager"
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), (actual, expected)
        for a, e in zip(actual, expected):
            assert_equal_state(a, e, rtol, atol)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), (actual, expected)
        for k in expected:
            assert_equal_state(actual[k], expected[k], rtol, atol)
    elif hasattr(expected, "__dict__") and not isinstance(expected, type):
        assert type(actual) is type(expected)
        assert_equal_state(vars(actual), vars(expected), rtol, atol)
    else:
        assert actual == expected, (actual, expected)


def check_graphs(fn, *args, graphs=None, fullgraph=False, **compile_kwargs):
    """Compile `fn` with a CompileCounter, check results and argument state against eager, and (when
    `graphs` is given) that exactly that many graphs reached the backend. Returns the counter."""
    import kiln  # looked up at call time so the torch peer (KILN_TEST_PEER=torch) can stand in
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, fullgraph=fullgraph, **compile_kwargs)
    assert_same(fn, compiled, *args)
    if graphs is not None:
        assert counter.frame_count == graphs, f"expected {graphs} graph(s), got {counter.frame_count}"
    return counter


def use_torch_peer():
    """Swap kiln's public API for torch.compile's counterparts (KILN_TEST_PEER=torch).

    Runs the acceptance tests against the reference to prove the tests themselves right: results,
    graph counts and errors the tests expect must be what torch.compile gives (where torch agrees
    with eager). kiln-only API (KILN_LOGS, warnings) is skipped via the `kiln_only` marker.
    """
    import torch._dynamo
    import torch._dynamo.exc as dynamo_exc
    import kiln
    if kiln.compile is torch.compile:  # already swapped (both conftests call this)
        return

    class PeerConfig:
        _names = {"cache_size_limit": "recompile_limit", "suppress_errors": "suppress_errors"}

        def patch(self, **changes):
            return torch._dynamo.config.patch(**{self._names[k]: v for k, v in changes.items()})

    def explain(fn):
        def run(*args, **kwargs):
            out = torch._dynamo.explain(fn)(*args, **kwargs)
            out.guards = out.out_guards
            return out
        return run

    kiln.compile = torch.compile
    kiln.reset = torch._dynamo.reset
    kiln.disable = torch._dynamo.disable
    kiln.explain = explain
    kiln.config = PeerConfig()
    kiln.Unsupported = (dynamo_exc.Unsupported, dynamo_exc.UserError)
    kiln.BackendCompilerFailed = dynamo_exc.BackendCompilerFailed
