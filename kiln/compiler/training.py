"""Training: graphs whose inputs require grad run compiled code forward and backward.

`compile_training(gm, example_inputs, options, inner)`:

1. analyse: the aot trace (`trace_aten`) says which inputs `gm` writes and which outputs are
   inputs or views of them; a fake run with grad on says which outputs require grad and which
   writes autograd records;
2. trace the joint graph `(*primals, *tangents) -> (*outputs, *new values of written inputs,
   *gradients)` with make_fx, `torch.autograd.grad` inside; then functionalize that graph with a
   second make_fx (functionalization drops requires_grad, so it cannot wrap the autograd trace);
3. partition it into a forward and a backward graph (`kiln.compiler.partition`);
4. compile the forward now and the backward at its first call; run both inside one
   `torch.autograd.Function`, then write the inputs back and rebuild the outputs that alias
   inputs, as eager would.

Grad-mode regions inside `gm` (`torch._C._set_grad_enabled` calls) and `detach` take effect
while tracing step 2, so the gradients they cut are simply absent from the joint graph.
Parameters and buffers `gm` reads through `get_attr` are treated as extra inputs. With dynamic
sizes the trace uses the symbolic fake values capture records on the placeholders, so one
compiled forward and backward serve every size. Double backward through the compiled backward
is refused with an error (it is not differentiable), never answered with a wrong gradient.
"""
import dataclasses

import torch
import torch.utils._pytree as pytree
from torch.fx import traceback as fx_traceback
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.compiler.aot import MetaKeepingModule, is_symbolic, meta_keeping, trace_aten
from kiln.compiler.runner import rebuilder
from kiln.compiler.decompositions import lowering_decompositions
from kiln.compiler.partition import partition
from kiln.debug import report
from kiln.debug.logs import enabled, log


def compile_training(gm, example_inputs, options, inner, *, recompute=True):
    """Compile `gm` for training; returns a callable over the flat inputs, as backends do.

    `recompute`: let the partitioner recompute cheap values in the backward instead of saving
    them (min-cut); False saves every forward value the backward reads."""
    return _GradModeVariants(gm, dict(options or {}), inner, recompute, example_inputs)


class _GradModeVariants:
    """The compiled graph for each grad situation seen: one graph may be called with inputs that
    require grad differently, or under no_grad; each situation gets its own compiled code."""

    def __init__(self, gm, options, inner, recompute, example_inputs):
        self.gm, self.options, self.inner, self.recompute = gm, options, inner, recompute
        self.params_need_grad = any(p.requires_grad for p in gm.parameters())
        self.variants = {}
        self.variants[self._key(example_inputs)] = self._compile(example_inputs)

    def __call__(self, *args):
        key = self._key(args)
        compiled = self.variants.get(key)
        if compiled is None:
            compiled = self.variants[key] = self._compile(args)
        return compiled(*args)

    def _key(self, args):
        """(any gradient to compute, which inputs require grad)."""
        requires = tuple([isinstance(a, torch.Tensor) and a.requires_grad for a in args])
        return torch.is_grad_enabled() and (self.params_need_grad or any(requires)), requires

    def _compile(self, example_inputs):
        if not self._key(example_inputs)[0]:
            from kiln.compiler import compile_fx  # no gradient to compute: the inference path
            with torch.no_grad():
                return compile_fx(self.gm, _detached(example_inputs), self.options, self.inner)
        with report.stage("aot"):  # the joint trace and partition; the two graphs' compiles time themselves
            return TrainingGraph(self.gm, example_inputs, self.options, self.inner, self.recompute)


class FlatGraph:
    """`gm` as a function of (*inputs, *module tensors): the parameters and buffers it reads
    through `get_attr` become inputs, so they get gradients and write-backs as inputs do."""

    def __init__(self, gm):
        named = {**dict(gm.named_parameters()), **dict(gm.named_buffers())}
        self.gm, self.names, self.state = gm, list(named), list(named.values())

    def __call__(self, *flat):
        # node by node (aot.meta_keeping), so the aten nodes of a trace keep each node's user line
        if not self.names:
            return meta_keeping(self.gm)(*flat)
        num_inputs = len(flat) - len(self.names)
        return torch.func.functional_call(MetaKeepingModule(self.gm), {f"gm.{n}": t for n, t in zip(
            self.names, flat[num_inputs:])}, tuple(flat[:num_inputs]))


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    """What the flat graph takes and returns, as autograd sees it."""
    requires_grad: tuple          # per input: does it require grad
    out_spec: pytree.TreeSpec     # rebuilds gm's output structure from the flat outputs
    aliases: tuple                # (output index, input index, as_strided view or None): outputs
                                  # eager returns as inputs or views of them, rebuilt from the input
    computed: tuple               # indices of the other outputs: the compiled graph computes them
    output_requires_grad: tuple   # per computed output
    mutated: tuple                # inputs gm writes in place
    mutation_differentiable: tuple  # per mutated input: autograd recorded the write

    @property
    def num_outputs(self):
        return len(self.aliases) + len(self.computed)

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
        """Per forward result (computed outputs, then new values of mutated inputs)."""
        return self.output_requires_grad + self.mutation_differentiable


class TrainingGraph:
    """One graph compiled for training: a forward, a lazily compiled backward, and the signature
    that maps autograd's view onto them."""

    def __init__(self, gm, example_inputs, options, inner, recompute):
        self.options, self.inner = options, inner
        self.flat_graph = FlatGraph(gm)
        primals = [*_traced_inputs(gm, example_inputs), *self.flat_graph.state]
        decompositions = lowering_decompositions(bool(options.get("fallback_random")))
        fake_mode = _fake_mode(primals)
        self.signature = analyse(self.flat_graph, example_inputs, primals, fake_mode, decompositions)
        joint = trace_joint(self.flat_graph, self.signature, fake_mode, primals, decompositions)
        self.num_forward = len(self.signature.differentiable)
        self.partition = partition(joint, len(primals), self.num_forward, recompute=recompute,
                                   unsaveable=self.signature.mutated)
        if enabled("aot"):
            log("aot", "partition: %d saved values, %d bytes\nforward:%s\nbackward:%s",
                self.partition.num_saved, self.partition.saved_bytes, self.partition.forward.code,
                self.partition.backward.code)
        self.forward = _compile_graph(self.partition.forward, _detached(primals), options, inner)
        self._backward = None
        self.plan = RuntimePlan.of(self.signature, self.partition, self.num_forward)

    def __call__(self, *args):
        flat = (*args, *self.flat_graph.state) if self.flat_graph.state else args
        results = _CompiledFunction.apply(self, *flat)
        if self.plan.outputs_are_results:  # no writes, no aliases: the common case
            return self.plan.rebuild(results)
        sig = self.signature
        _write_back(sig, flat, results[len(sig.computed):])
        outputs = [None] * sig.num_outputs
        for k, value in zip(sig.computed, results):
            outputs[k] = value
        for k, i, view in sig.aliases:  # after the write-back: views see the new values
            outputs[k] = flat[i] if view is None else flat[i].as_strided(*view)
        return pytree.tree_unflatten(outputs, sig.out_spec)

    def backward(self, saved, tangents):
        if self._backward is None:  # compiled at the first backward, kept for the next ones
            self._backward = _compile_graph(self.partition.backward, [*saved, *tangents],
                                            self.options, self.inner)
        return self._backward(*saved, *tangents)


@dataclasses.dataclass(frozen=True)
class RuntimePlan:
    """What each call does, decided once at compile time so a call runs little Python: the
    general path (writes, aliases, saved sizes, inputs or outputs without grad) only when the
    signature has them."""
    outputs_are_results: bool     # gm's outputs are exactly the forward's results, in order
    rebuild: object               # results (a tuple) -> gm's output structure
    saved_all_tensors: bool       # no size (SymInt) among the saved values
    non_differentiable: tuple     # indices of forward results autograd must not differentiate
    all_differentiable: bool
    all_inputs_need_grad: bool

    @staticmethod
    def of(sig, partition, num_forward):
        saved = partition.forward.graph.output_node().args[0][num_forward:]
        differentiable = sig.differentiable
        outputs_are_results = not sig.mutated and not sig.aliases
        return RuntimePlan(
            outputs_are_results, rebuilder(sig.out_spec) if outputs_are_results else None,
            all(isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor) for n in saved),
            tuple(k for k, d in enumerate(differentiable) if not d), all(differentiable),
            all(sig.requires_grad))


class _CompiledFunction(torch.autograd.Function):
    """The compiled forward and backward as one autograd node."""

    @staticmethod
    def forward(ctx, graph, *args):
        results = graph.forward(*args)
        num_forward, plan = graph.num_forward, graph.plan
        outputs, saved = results[:num_forward], results[num_forward:]
        ctx.graph = graph
        # sizes (with dynamic shapes) are saved as plain values; tensors go through autograd's
        # saved-tensor checks, so a later in-place write to one is an error, as in eager
        if not plan.saved_all_tensors:
            ctx.is_tensor = [isinstance(s, torch.Tensor) for s in saved]
            ctx.sizes = [s for s in saved if not isinstance(s, torch.Tensor)]
            saved = [s for s in saved if isinstance(s, torch.Tensor)]
        ctx.save_for_backward(*_unalias_saved(saved, args, graph.signature.mutated))
        if plan.non_differentiable:
            ctx.mark_non_differentiable(*(outputs[k] for k in plan.non_differentiable))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():  # create_graph=True: the compiled backward is not differentiable
            raise RuntimeError("kiln: double backward (create_graph=True) through a compiled training "
                               "graph is not supported; compile with backend='eager' or run that "
                               "code eagerly (kiln.disable)")
        graph = ctx.graph
        plan, sig = graph.plan, graph.signature
        # the graph was traced with contiguous tangents; compiled code may assume their strides
        # (contiguous() returns a contiguous tangent itself, no copy)
        if plan.all_differentiable:
            tangents = [g.contiguous() for g in grad_outputs]
        else:
            tangents = [g.contiguous() for g, d in zip(grad_outputs, sig.differentiable) if d]
        grads = graph.backward(_saved_values(ctx, plan), tangents)
        if plan.all_inputs_need_grad:
            return (None, *grads)
        grad_inputs = [None] * len(sig.requires_grad)
        for i, g in zip(sig.grad_inputs, grads):
            grad_inputs[i] = g
        return (None, *grad_inputs)


def _saved_values(ctx, plan):
    """The saved values in the backward graph's order: tensors and sizes merged back."""
    if plan.saved_all_tensors:
        return ctx.saved_tensors
    tensors, sizes = iter(ctx.saved_tensors), iter(ctx.sizes)
    return [next(tensors) if is_tensor else next(sizes) for is_tensor in ctx.is_tensor]


def _unalias_saved(saved, args, mutated):
    """Compiled code may hand back an input itself where the graph copies it (an elided clone);
    a saved value sharing memory with an input the write-back overwrites must be a real copy."""
    if not mutated:
        return saved
    written = {args[i].untyped_storage().data_ptr() for i in mutated}
    return [s.clone() if s.untyped_storage().data_ptr() in written else s for s in saved]


def _write_back(sig, args, new_values):
    """Apply the in-place writes gm made to its inputs, recorded by autograd where eager's were."""
    for i, differentiable, new in zip(sig.mutated, sig.mutation_differentiable, new_values):
        if differentiable:
            args[i].copy_(new)
        else:
            with torch.no_grad():
                args[i].copy_(new)


def analyse(flat_graph, example_inputs, primals, fake_mode, decompositions):
    """The signature of `flat_graph` on `primals`: writes and aliases from the aot trace of the
    user graph on its example inputs (it sees writes hidden inside ops, such as batch norm's
    running stats, and reads symbolic sizes off the placeholders itself); requires_grad from a
    fake run with grad on."""
    num_inputs = len(example_inputs)
    aten_graph = trace_aten(flat_graph.gm, _detached(example_inputs), decompositions)
    aliases = tuple((a.output_index, a.input_index, a.view) for a in aten_graph.output_aliases)
    aliased = {k for k, _, _ in aliases}
    computed = tuple(k for k in range(aten_graph.num_user_outputs) if k not in aliased)
    state_index = {id(t): num_inputs + k for k, t in enumerate(flat_graph.state)}
    mutated = tuple(aten_graph.mutated_inputs) + tuple(state_index[id(t)] for t in aten_graph.mutated_attrs)
    requires_grad = tuple(isinstance(x, torch.Tensor) and x.requires_grad for x in primals)
    cloned = {i for i in mutated if requires_grad[i]}
    fakes = _fakes(fake_mode, primals)
    with fake_mode:
        inputs, outputs, clone_grad_fns = _run_user_graph(flat_graph, fakes, cloned)
    flat = pytree.tree_leaves(outputs)
    differentiable = tuple(
        inputs[i].grad_fn is not clone_grad_fns[i] if i in cloned else inputs[i].requires_grad
        for i in mutated)
    return GraphSignature(requires_grad, aten_graph.out_spec, aliases, computed,
                          tuple(flat[k].requires_grad for k in computed), mutated, differentiable)


def _run_user_graph(flat_graph, primals, cloned):
    """flat_graph(*primals) with grad on, as eager would run it; the inputs in `cloned` are
    replaced by clones first. Returns (the inputs it ran on, its outputs, the clones' grad_fns)."""
    with torch.enable_grad():
        inputs = [p.clone() if i in cloned else p for i, p in enumerate(primals)]
        clone_grad_fns = {i: inputs[i].grad_fn for i in cloned}
        outputs = flat_graph(*inputs)
    return inputs, outputs, clone_grad_fns


def trace_joint(flat_graph, sig, fake_mode, primals, decompositions):
    """The functional aten joint graph: (*primals, *tangents) -> (*forward results, *gradients)."""
    joint_fn = _joint_function(flat_graph, sig)
    fakes = _fakes(fake_mode, primals)
    with fake_mode:
        tangents = [torch.empty_like(r, memory_format=torch.contiguous_format)
                    for r, d in zip(_forward_results(flat_graph, sig, fakes), sig.differentiable) if d]
        with fx_traceback.preserve_node_meta():
            with_autograd = make_fx(joint_fn, decomposition_table=decompositions)(*fakes, *tangents)
        args = (*_detached(fakes), *tangents)
        functional = _functionalize(with_autograd, args, decompositions)
        if _writes_intermediates(functional):
            # a decomposition applied during functionalization may itself write in place
            functional = _functionalize(functional, args, decompositions)
    _drop_input_write_backs(functional, sig.mutated)
    if enabled("aot"):
        log("aot", "joint graph:\n%s", functional.code)
    return functional


def _functionalize(gm, args, decompositions):
    with torch.no_grad(), fx_traceback.preserve_node_meta():
        return make_fx(torch.func.functionalize(meta_keeping(gm), remove="mutations"),
                       decomposition_table=decompositions)(*args)


def _writes_intermediates(gm):
    """Whether an in-place op other than the final write-back of an input is in the graph."""
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               and not (n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder")
               for n in gm.graph.nodes)


def _forward_results(flat_graph, sig, primals):
    """Forward results (computed outputs, then new values of written inputs), detached."""
    inputs, outputs, _ = _run_user_graph(flat_graph, primals, sig.cloned)
    return [r.detach() for r in _results(sig, inputs, outputs)]


def _results(sig, inputs, outputs):
    flat = pytree.tree_leaves(outputs)
    return [flat[k] for k in sig.computed] + [inputs[i] for i in sig.mutated]


def _joint_function(flat_graph, sig):
    num_primals = len(sig.requires_grad)

    def joint(*args):
        primals, tangents = args[:num_primals], args[num_primals:]
        inputs, outputs, _ = _run_user_graph(flat_graph, primals, sig.cloned)
        results = _results(sig, inputs, outputs)
        differentiable = [r for r, d in zip(results, sig.differentiable) if d]
        wrt = [primals[i] for i in sig.grad_inputs]
        if differentiable:
            grads = torch.autograd.grad(differentiable, wrt, tangents, allow_unused=True)
        else:
            grads = [None] * len(wrt)
        return (*results, *grads)
    return joint


def _drop_input_write_backs(gm, mutated):
    """Functionalization ends with `copy_(input, new value)` for each written input; the new
    values are already results of the joint graph, and the runtime writes them back."""
    position = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default):
        if n.args[0] in position:
            # the analysis must have seen this write, or the runtime would not replay it
            assert position[n.args[0]] in mutated and not n.users, n.format_node()
            gm.graph.erase_node(n)
    gm.recompile()


def _compile_graph(gm, example_inputs, options, inner):
    """A functional aten graph -> callable(*flat inputs) -> tuple."""
    if inner == "cpp":
        from kiln.compiler import compile_aten
        return compile_aten(gm, example_inputs, options)
    return gm.forward


def _traced_inputs(gm, example_inputs):
    """What to trace with. Capture passes real example inputs, of one size each, and records on
    each placeholder its fake value, with symbolic sizes where a dimension is dynamic: when there
    are any, trace with those, so one compiled graph serves every size."""
    fakes = [p.meta.get("example_value") for p in gm.graph.find_nodes(op="placeholder")]
    if len(fakes) != len(example_inputs) or not any(is_symbolic(f) for f in fakes):
        return list(example_inputs)
    traced = [f if is_symbolic(f) or isinstance(f, FakeTensor) else x for f, x in zip(fakes, example_inputs)]
    if any(t.requires_grad != x.requires_grad for t, x in zip(traced, example_inputs)
           if isinstance(x, torch.Tensor)):
        return list(example_inputs)  # not the values these inputs were captured from
    return traced


def _fake_mode(example_inputs):
    for x in example_inputs:
        if isinstance(x, FakeTensor):
            return x.fake_mode
    return FakeTensorMode()


def _fakes(fake_mode, example_inputs):
    """Fake leaves for the real tensors, requiring grad as they do; fakes stay as they are.
    Called outside the fake mode: it detaches real tensors."""
    return [_fake(fake_mode, x) for x in example_inputs]


def _fake(fake_mode, x):
    if not isinstance(x, torch.Tensor) or isinstance(x, FakeTensor):
        return x
    # fakes a leaf (a non-leaf's history means nothing here, and reading it warns)
    return fake_mode.from_tensor(x.detach()).requires_grad_(x.requires_grad)


def _detached(xs):
    return [x.detach() if isinstance(x, torch.Tensor) else x for x in xs]
