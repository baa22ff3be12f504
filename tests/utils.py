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


def counting_backend(backend=None):
    """A CompileCounter that also compiles each graph with `backend` (a name; None or "eager": the graph
    runs as captured). Under KILN_TEST_PEER=torch, torch's counterpart."""
    import os
    if backend in (None, "eager"):
        return CompileCounter()
    if os.environ.get("KILN_TEST_PEER") == "torch":
        from torch._dynamo.testing import CompileCounterWithBackend
        return CompileCounterWithBackend(backend)
    from kiln.backends.registry import lookup_backend
    inner = lookup_backend(backend)

    class Counting(CompileCounter):
        def __call__(self, gm, example_inputs):
            super().__call__(gm, example_inputs)
            return inner(gm, example_inputs)
    return Counting()


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
        _names = {"cache_size_limit": "recompile_limit", "suppress_errors": "suppress_errors",
                  "capture_scalar_outputs": "capture_scalar_outputs",
                  "automatic_dynamic_shapes": "automatic_dynamic_shapes"}

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


def _outcome(fn, args):
    """(result, exception) of fn(*args): a program may raise, and the compiled one must raise alike."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 (the exception is the result being compared)
        return None, e


def check_calls(fn, calls, graphs=None, backend=None, state=None, rtol=1e-5, atol=1e-6, **compile_kwargs):
    """Call `fn` eagerly and compiled once per argument tuple in `calls` (so guards see new shapes,
    dtypes and Python values); each call's result or exception, its arguments afterwards, and the
    `state` (a pair `(get, put)`: snapshot and restore of outside state such as globals or RNG) must
    match eager. `graphs`: the graphs the backend got over all calls (with the counting backend).
    Returns the counter (None when `backend` is given)."""
    import kiln
    counter = CompileCounter() if backend is None else None
    compiled = kiln.compile(fn, backend=counter or backend, **compile_kwargs)
    for i, args in enumerate(calls):
        eager_args, compiled_args = clone_args(args), clone_args(args)
        before = copy.deepcopy(state[0]()) if state else None
        expected, eager_error = _outcome(fn, eager_args)
        after_eager = copy.deepcopy(state[0]()) if state else None
        if state:
            state[1](before)
        actual, error = _outcome(compiled, compiled_args)
        assert type(error) is type(eager_error), f"call {i}: eager raised {eager_error!r}, compiled {error!r}"
        assert_equal_state(actual, expected, rtol, atol)
        for e, c in zip(eager_args, compiled_args):
            assert_equal_state(c, e, rtol, atol)
        if state:
            assert_equal_state(copy.deepcopy(state[0]()), after_eager, rtol, atol)
    if graphs is not None and counter is not None:
        assert counter.frame_count == graphs, f"expected {graphs} graph(s), got {counter.frame_count}"
    return counter


def module_state(mod):
    """What a call may change in a module tree: parameters and buffers, training flags and plain
    Python attributes (counters, flags) of every submodule."""
    state = {k: v.detach().clone() for k, v in mod.state_dict(keep_vars=True).items()}
    for name, sub in mod.named_modules():
        state[f"{name}:training"] = sub.training
        for k, v in vars(sub).items():
            if not k.startswith("_") and isinstance(v, (int, float, str, bool, type(None))):
                state[f"{name}:{k}"] = v
    return state


def check_module_calls(make, calls, between=None, graphs=None, backend=None, rtol=1e-4, atol=1e-5,
                       backward=False):
    """Build a module twice with the same seed (`make()`), compile one, and call both per argument
    tuple in `calls`; `between(mod, i)` changes each module before call i (train/eval, a swapped
    submodule), seeded alike. Results, arguments, module state and (with `backward`) parameter
    gradients must match eager; RNG is seeded alike before each call, so dropout matches too."""
    import kiln
    torch.manual_seed(0)
    eager_mod = make()
    torch.manual_seed(0)
    compiled_mod = make()
    counter = CompileCounter() if backend is None else None
    compiled = kiln.compile(compiled_mod, backend=counter or backend)
    for i, args in enumerate(calls):
        for m in (eager_mod, compiled_mod):
            if between is not None:
                torch.manual_seed(100 + i)
                between(m, i)
        eager_args, compiled_args = clone_args(args), clone_args(args)
        torch.manual_seed(i)
        expected = eager_mod(*eager_args)
        torch.manual_seed(i)
        actual = compiled(*compiled_args)
        assert_equal_state(actual, expected, rtol, atol)
        for e, c in zip(eager_args, compiled_args):
            assert_equal_state(c, e, rtol, atol)
        assert_equal_state(module_state(compiled_mod), module_state(eager_mod), rtol, atol)
        if backward:
            _backward_matches(eager_mod, compiled_mod, expected, actual, rtol, atol)
    if graphs is not None and counter is not None:
        assert counter.frame_count == graphs, f"expected {graphs} graph(s), got {counter.frame_count}"
    return counter


def _backward_matches(eager_mod, compiled_mod, expected, actual, rtol, atol):
    def loss(out):
        outs = out if isinstance(out, (tuple, list)) else [out]
        return sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
    for mod, out in ((eager_mod, expected), (compiled_mod, actual)):
        mod.zero_grad(set_to_none=True)
        loss(out).backward()
    for (name, pe), (_, pc) in zip(eager_mod.named_parameters(), compiled_mod.named_parameters()):
        assert (pe.grad is None) == (pc.grad is None), f"{name}: grad presence differs"
        if pe.grad is not None:
            torch.testing.assert_close(pc.grad, pe.grad, rtol=rtol, atol=atol)
