"""Training: graphs whose inputs require grad run compiled code forward and backward.

`compile_training(gm, example_inputs, options, inner)`:

1. analyse: run `gm` once on fake inputs, with grad on, to learn which outputs require grad and
   which inputs it writes in place (and whether autograd saw the write);
2. trace the joint graph `(*primals, *tangents) -> (*outputs, *new values of mutated inputs,
   *gradients)` with make_fx, `torch.autograd.grad` inside; then functionalize it with a
   second make_fx, so the joint graph is pure aten;
3. partition it into a forward and a backward graph (`kiln.compiler.partition`);
4. compile the forward now and the backward at its first call; run both inside one
   `torch.autograd.Function`, then write the mutated inputs back as eager would.

Grad-mode regions inside `gm` (`torch._C._set_grad_enabled` calls) and `detach` take effect
while tracing step 2, so the gradients they cut are simply absent from the joint graph.
"""
import dataclasses

import torch
import torch.utils._pytree as pytree
from torch._decomp import get_decompositions
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.compiler.partition import partition
from kiln.debug.logs import enabled, log

aten = torch.ops.aten

# Random ops whose decomposition would draw numbers differently from eager.
_RANDOM_OPS = {"bernoulli", "native_dropout", "rand", "rand_like", "randn", "randn_like", "randint",
               "randint_like", "normal", "uniform", "exponential", "geometric", "log_normal",
               "cauchy", "multinomial", "randperm", "rrelu", "rrelu_with_noise"}


def compile_training(gm, example_inputs, options, inner, *, recompute=True):
    """Compile `gm` for training; returns a callable over the flat inputs, as backends do.

    `recompute`: let the partitioner recompute cheap values in the backward instead of saving
    them (min-cut); False saves every forward value the backward reads."""
    options = dict(options or {})
    return _GradModeVariants(gm, options, inner, recompute, example_inputs)


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    """What the user graph takes and returns, as autograd sees it."""
    requires_grad: tuple        # per input: does it require grad
    out_spec: pytree.TreeSpec   # rebuilds gm's output structure from the flat outputs
    output_requires_grad: tuple  # per flat output
    mutated: tuple              # inputs gm writes in place
    mutation_differentiable: tuple  # per mutated input: autograd recorded the write

    @property
    def grad_inputs(self):
        return [i for i, r in enumerate(self.requires_grad) if r]

    @property
    def cloned(self):
        """Inputs the trace clones before running gm: they require grad and gm writes to them. A
        fake leaf written in place would raise, where the caller's real input may be a non-leaf."""
        return {i for i in self.mutated if self.requires_grad[i]}

    @property
    def differentiable(self):
        """Per forward result (flat outputs, then new values of mutated inputs)."""
        return self.output_requires_grad + self.mutation_differentiable


class _GradModeVariants:
    """The compiled graph for each grad situation seen: capture may call one graph with inputs
    that require grad differently, or under no_grad; each gets its own compiled code."""

    def __init__(self, gm, options, inner, recompute, example_inputs):
        self.gm, self.options, self.inner, self.recompute = gm, options, inner, recompute
        self.variants = {}
        self.variants[_grad_key(example_inputs)] = self._compile(example_inputs)

    def __call__(self, *args):
        key = _grad_key(args)
        compiled = self.variants.get(key)
        if compiled is None:
            compiled = self.variants[key] = self._compile(args)
        return compiled(*args)

    def _compile(self, example_inputs):
        if not _grad_key(example_inputs)[0]:
            from kiln.compiler import compile_fx  # no gradients needed: the inference path
            detached = [x.detach() if isinstance(x, torch.Tensor) else x for x in example_inputs]
            with torch.no_grad():
                return compile_fx(self.gm, detached, self.options, self.inner)
        return TrainingGraph(self.gm, example_inputs, self.options, self.inner, self.recompute)


def _grad_key(args):
    """(any gradient to compute, which inputs require grad)."""
    requires = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    return torch.is_grad_enabled() and any(requires), requires


class TrainingGraph:
    """One user graph compiled for training: a forward, a lazily compiled backward, and the
    signature that maps autograd's view onto them."""

    def __init__(self, gm, example_inputs, options, inner, recompute):
        self.options, self.inner = options, inner
        fake_mode = _fake_mode(example_inputs)
        decompositions = _decompositions(options)
        with fake_mode:
            self.signature = analyse(gm, _fakes(fake_mode, example_inputs), decompositions)
        joint = trace_joint(gm, self.signature, fake_mode, example_inputs, decompositions)
        num_forward = len(self.signature.differentiable)
        self.partition = partition(joint, len(example_inputs), num_forward, recompute=recompute,
                                   unsaveable=self.signature.mutated)
        log("aot", "partition: %d saved values, %d bytes", self.partition.num_saved,
            self.partition.saved_bytes)
        self.num_forward = num_forward
        self.forward = _compile_graph(self.partition.forward, _detached(example_inputs), options, inner)
        self._backward = None

    def __call__(self, *args):
        results = _CompiledFunction.apply(self, *args)
        sig = self.signature
        num_outputs = len(sig.output_requires_grad)
        _write_back(sig, args, results[num_outputs:])
        return pytree.tree_unflatten(list(results[:num_outputs]), sig.out_spec)

    def backward(self, saved, tangents):
        if self._backward is None:  # compiled at the first backward, kept for the next ones
            self._backward = _compile_graph(self.partition.backward, [*saved, *tangents],
                                            self.options, self.inner)
        return self._backward(*saved, *tangents)


class _CompiledFunction(torch.autograd.Function):
    """The compiled forward and backward as one autograd node."""

    @staticmethod
    def forward(ctx, graph, *args):
        results = graph.forward(*args)
        outputs, saved = results[:graph.num_forward], results[graph.num_forward:]
        ctx.graph = graph
        ctx.save_for_backward(*saved)
        ctx.mark_non_differentiable(*(o for o, d in zip(outputs, graph.signature.differentiable) if not d))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():  # create_graph=True: the compiled backward is not differentiable
            raise RuntimeError("kiln: double backward (create_graph=True) through a compiled training "
                               "graph is not supported; compile with backend='eager' or run that "
                               "code eagerly (kiln.disable)")
        graph = ctx.graph
        sig = graph.signature
        # the graph was traced with contiguous tangents; compiled code may assume their strides
        tangents = [g.contiguous() for g, d in zip(grad_outputs, sig.differentiable) if d]
        grads = graph.backward(list(ctx.saved_tensors), tangents)
        grad_inputs = [None] * len(sig.requires_grad)
        for i, g in zip(sig.grad_inputs, grads):
            grad_inputs[i] = g
        return (None, *grad_inputs)


def _write_back(sig, args, new_values):
    """Apply the in-place writes gm made to its inputs, recorded by autograd where eager's were."""
    for i, differentiable, new in zip(sig.mutated, sig.mutation_differentiable, new_values):
        if differentiable:
            args[i].copy_(new)
        else:
            with torch.no_grad():
                args[i].copy_(new)


def analyse(gm, fake_inputs, decompositions):
    """Run gm on fake inputs with grad on (traced, with the decompositions); read its signature
    off the results and the trace."""
    requires_grad = tuple(isinstance(x, torch.Tensor) and x.requires_grad for x in fake_inputs)
    maybe_cloned = {i for i, r in enumerate(requires_grad) if r}
    seen = {}

    def run(*primals):
        seen["inputs"], seen["outputs"], seen["clone_grad_fns"] = _run_user_graph(gm, primals, maybe_cloned)
        return pytree.tree_leaves(seen["outputs"])
    traced = make_fx(run, decomposition_table=decompositions)(*fake_inputs)
    inputs, clone_grad_fns = seen["inputs"], seen["clone_grad_fns"]
    flat, spec = pytree.tree_flatten(seen["outputs"])
    _check_tensors(flat)
    written_clones = {i for i in maybe_cloned if inputs[i]._version != 0}
    mutated = tuple(sorted(written_clones | _written_inputs(traced, fake_inputs)))
    differentiable = tuple(
        inputs[i].grad_fn is not clone_grad_fns[i] if i in maybe_cloned else inputs[i].requires_grad
        for i in mutated)
    return GraphSignature(requires_grad, spec, tuple(o.requires_grad for o in flat), mutated,
                          differentiable)


def _written_inputs(traced, fake_inputs):
    """Indices of the inputs `traced` writes to. Functionalization ends its graph with a
    `copy_(input, new value)` per written input; version counters would miss the writes an op
    makes below autograd (batch norm's running stats)."""
    with torch.no_grad():
        functional = make_fx(torch.func.functionalize(traced, remove="mutations"))(*_detached(fake_inputs))
    placeholders = [n for n in functional.graph.nodes if n.op == "placeholder"]
    return {placeholders.index(n.args[0]) for n in functional.graph.nodes
            if n.target is aten.copy_.default and n.args[0] in placeholders}


def _run_user_graph(gm, primals, cloned):
    """gm(*primals) with grad on, as eager would run it; the inputs in `cloned` are replaced by
    clones first. Returns (the inputs gm ran on, its outputs, the clones' grad_fns)."""
    with torch.enable_grad():
        inputs = [p.clone() if i in cloned else p for i, p in enumerate(primals)]
        clone_grad_fns = {i: inputs[i].grad_fn for i in cloned}
        outputs = gm(*inputs)
    return inputs, outputs, clone_grad_fns


def _check_tensors(flat_outputs):
    for o in flat_outputs:
        if not isinstance(o, torch.Tensor):
            raise NotImplementedError(f"kiln training graphs return tensors only; got a {type(o).__name__}")


def trace_joint(gm, sig, fake_mode, example_inputs, decompositions):
    """The functional aten joint graph: (*primals, *tangents) -> (*forward results, *gradients)."""
    joint_fn = _joint_function(gm, sig)
    with fake_mode:
        primals = _fakes(fake_mode, example_inputs)
        tangents = [torch.empty_like(r) for r, d in zip(_forward_results(gm, sig, primals), sig.differentiable) if d]
        with_autograd = make_fx(joint_fn, decomposition_table=decompositions)(*primals, *tangents)
        plain = [p.detach() if isinstance(p, torch.Tensor) else p for p in _fakes(fake_mode, example_inputs)]
        with torch.no_grad():
            functional = make_fx(torch.func.functionalize(with_autograd, remove="mutations"),
                                 decomposition_table=decompositions)(*plain, *tangents)
    _drop_input_write_backs(functional)
    if enabled("aot"):
        log("aot", "joint graph:\n%s", functional.code)
    return functional


def _forward_results(gm, sig, primals):
    """Fake forward results (outputs, then new values of mutated inputs): the tangents' shapes."""
    inputs, outputs, _ = _run_user_graph(gm, primals, sig.cloned)
    return [t.detach() for t in pytree.tree_leaves(outputs) + [inputs[i] for i in sig.mutated]]


def _joint_function(gm, sig):
    num_primals = len(sig.requires_grad)

    def joint(*args):
        primals, tangents = args[:num_primals], args[num_primals:]
        inputs, outputs, _ = _run_user_graph(gm, primals, sig.cloned)
        results = pytree.tree_leaves(outputs) + [inputs[i] for i in sig.mutated]
        differentiable = [r for r, d in zip(results, sig.differentiable) if d]
        wrt = [primals[i] for i in sig.grad_inputs]
        if differentiable:
            grads = torch.autograd.grad(differentiable, wrt, tangents, allow_unused=True)
        else:
            grads = [None] * len(wrt)
        return (*results, *grads)
    return joint


def _drop_input_write_backs(gm):
    """Functionalization ends with `copy_(input, new value)` for each mutated input; the new
    values are already results of the joint graph, and the runtime writes them back."""
    for n in list(gm.graph.nodes):
        if n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder" and not n.users:
            gm.graph.erase_node(n)
    gm.recompile()


def _compile_graph(gm, example_inputs, options, inner):
    """A functional aten graph -> callable(*flat inputs) -> tuple."""
    if inner == "cpp":
        import kiln.compiler
        compile_aten = getattr(kiln.compiler, "compile_aten", None)
        if compile_aten is not None:
            return compile_aten(gm, example_inputs, options)
        log("perf_hints", "compile_aten not available: training graph runs as an fx graph")
    return gm.forward


def _decompositions(options):
    """The lowering table, plus batch norm's: undecomposed, its running-stat writes are invisible
    to version counters and functionalization drops them."""
    try:
        from kiln.compiler.aot import lowering_decompositions
        table = dict(lowering_decompositions())
    except ImportError:  # the aot module is not there yet: torch's core aten set
        from torch._decomp import core_aten_decompositions
        table = dict(core_aten_decompositions())
    table.update(get_decompositions([aten.native_batch_norm, aten._native_batch_norm_legit,
                                     aten._batch_norm_with_update]))
    if options.get("fallback_random"):
        # random ops stay whole, so they draw from the generator exactly as eager does
        table = {op: fn for op, fn in table.items()
                 if op.overloadpacket.__name__ not in _RANDOM_OPS}
    return table


def _fake_mode(example_inputs):
    for x in example_inputs:
        if isinstance(x, FakeTensor):
            return x.fake_mode
    return FakeTensorMode()


def _fakes(fake_mode, example_inputs):
    return [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) else x
            for x in example_inputs]


def _detached(xs):
    return [x.detach() if isinstance(x, torch.Tensor) else x for x in xs]

