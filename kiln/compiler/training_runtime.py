"""A training graph as it runs: a compiled forward and backward inside one `torch.autograd.Function`,
the inputs written back and the outputs that alias inputs rebuilt, as eager would.

`TrainingRun` holds what a call needs (the signature, the per-call plan, the two compiled graphs);
training.py makes one by tracing and partitioning a graph, training_cache.py loads one from disk.
Apart from tracing, so a process that loads a training graph imports no make_fx, fake tensors or
sympy.
"""
import dataclasses
import operator

import torch
import torch.utils._pytree as pytree

from kiln.compiler.runner import rebuilder


def module_state(gm):
    """(names, tensors) of the parameters and buffers `gm` reads: the training graph's extra inputs."""
    named = {**dict(gm.named_parameters()), **dict(gm.named_buffers())}
    return list(named), list(named.values())


@dataclasses.dataclass(frozen=True)
class ReplayedView:
    """An aliased output rebuilt by the view ops eager applied to the input (aot.OutputAlias.ops),
    not by as_strided: on an input whose elements share memory (an expanded leaf), as_strided's
    gradient is spread over every element at a location the view reads, where eager's view ops
    give it to the elements viewed."""
    ops: tuple  # ((op, args, kwargs), ...)

    def of(self, x):
        for op, args, kwargs in self.ops:
            x = x[args[0]] if op is operator.getitem else op(x, *args, **kwargs)
        return x


def _alias_of(x, view):
    """An output that eager returns as input `x` (view None) or a view of it."""
    if view is None:
        return x
    return view.of(x) if isinstance(view, ReplayedView) else x.as_strided(*view)


@dataclasses.dataclass(frozen=True)
class GraphSignature:
    """What the flat graph takes and returns, as autograd sees it."""
    requires_grad: tuple          # per input: does it require grad
    out_spec: pytree.TreeSpec     # rebuilds gm's output structure from the flat outputs
    aliases: tuple                # (output index, input index, as_strided view, ReplayedView or None): outputs
                                  # eager returns as inputs or views of them, rebuilt from the input
    computed: tuple               # indices of the other outputs: the compiled graph computes them
    output_requires_grad: tuple   # per computed output
    mutated: tuple                # inputs gm writes in place
    mutation_differentiable: tuple  # per mutated input: autograd recorded the write
    views: tuple = ()             # (output, base output, view layout, base layout): outputs eager returns as
                                  # views of another output, made outside the autograd node (in-place
                                  # writes to them must stay legal, as in eager)
    no_gradient: tuple = ()       # inputs that require grad but get no gradient from the graph (only
                                  # detached inside it): passed detached, so autograd's graph ends there

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
    detach: tuple                 # inputs passed to the autograd node detached (sig.no_gradient)

    @staticmethod
    def of(sig, saved_all_tensors):
        differentiable = sig.differentiable
        outputs_are_results = not sig.mutated and not sig.aliases and not sig.views
        return RuntimePlan(
            outputs_are_results, rebuilder(sig.out_spec) if outputs_are_results else None, saved_all_tensors,
            tuple(k for k, d in enumerate(differentiable) if not d), all(differentiable),
            all(sig.requires_grad), sig.no_gradient)


class TrainingRun:
    """One graph compiled for training, ready to call: `forward` (flat inputs -> forward results,
    then saved values) and the backward (saved values, tangents -> gradients of the inputs that
    require grad), which `compile_backward()` makes at the first backward."""

    def __init__(self, signature, saved_all_tensors, state, forward, compile_backward):
        self.signature = signature
        self.num_forward = len(signature.differentiable)
        self.plan = RuntimePlan.of(signature, saved_all_tensors)
        self.state = state  # the module tensors the graph reads, passed after the call's inputs
        self.forward = forward
        self._compile_backward, self._backward = compile_backward, None

    def __call__(self, *args):
        flat = (*args, *self.state) if self.state else args
        if self.plan.detach:  # (eager's graph does not reach them: a backward must not run into their history)
            flat = tuple(x.detach() if i in self.plan.detach else x for i, x in enumerate(flat))
        results = _CompiledFunction.apply(self, *flat)
        if self.plan.outputs_are_results:  # no writes, no aliases: the common case
            return self.plan.rebuild(results)
        sig = self.signature
        _write_back(sig, flat, results[len(sig.computed):])
        outputs = [None] * sig.num_outputs
        for k, value in zip(sig.computed, results):
            outputs[k] = value
        for k, i, view in sig.aliases:  # after the write-back: views see the new values
            outputs[k] = _alias_of(flat[i], view)
        for k, j, view, base_layout in sig.views:
            base = outputs[j]
            if (base.stride(), base.storage_offset()) == base_layout:
                outputs[k] = base.as_strided(*view)
        return pytree.tree_unflatten(outputs, sig.out_spec)

    def backward(self, saved, tangents):
        if self._backward is None:  # compiled at the first backward, kept for the next ones
            self._backward = self._compile_backward(saved, tangents)
        return self._backward(*saved, *tangents)


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


def detached(xs):
    return [x.detach() if isinstance(x, torch.Tensor) else x for x in xs]
