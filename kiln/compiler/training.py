"""Training: graphs whose inputs require grad run compiled code forward and backward.

`TrainingGraph(gm, example_inputs, options, inner, recompute)` (grad_modes.compile_training makes
one on a miss of the training-graph cache):

1. analyse: the aot trace (`trace_aten`) says which inputs `gm` writes and which outputs are
   inputs or views of them; a fake run with grad on says which outputs require grad and which
   writes autograd records;
2. trace the joint graph `(*primals, *tangents) -> (*outputs, *new values of written inputs,
   *gradients)` with make_fx, `torch.autograd.grad` inside; then functionalize that graph with a
   second make_fx (functionalization drops requires_grad, so it cannot wrap the autograd trace);
3. partition it into a forward and a backward graph (`kiln.compiler.partition`);
4. compile the forward now and the backward at its first call; run both as a
   training_runtime.TrainingRun (one `torch.autograd.Function`, inputs written back and outputs
   that alias inputs rebuilt, as eager would).

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
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.compiler import backward_rewrites
from kiln.compiler.aot import (MetaKeepingModule, is_symbolic, may_overlap_itself, meta_keeping, trace_aten,
                              tracing_mode)
from kiln.compiler.decompositions import lowering_decompositions
from kiln.compiler.partition import partition
from kiln.compiler.training_runtime import GraphSignature, ReplayedView, TrainingRun, detached, module_state
from kiln.debug.logs import enabled, log
from kiln.torch_compat import forget_item_value


class FlatGraph:
    """`gm` as a function of (*inputs, *module tensors): the parameters and buffers it reads
    through `get_attr` become inputs, so they get gradients and write-backs as inputs do."""

    def __init__(self, gm):
        self.gm = gm
        self.names, self.state = module_state(gm)

    def __call__(self, *flat):
        # node by node (aot.meta_keeping), so the aten nodes of a trace keep each node's user line
        if not self.names:
            return meta_keeping(self.gm)(*flat)
        num_inputs = len(flat) - len(self.names)
        return torch.func.functional_call(MetaKeepingModule(self.gm), {f"gm.{n}": t for n, t in zip(
            self.names, flat[num_inputs:])}, tuple(flat[:num_inputs]))


class TrainingGraph(TrainingRun):
    """One graph compiled for training: traced, partitioned into a forward and a backward graph,
    the forward compiled now and the backward at its first call."""

    def __init__(self, gm, example_inputs, options, inner, recompute):
        self.options, self.inner = options, inner
        self.flat_graph = FlatGraph(gm)
        primals = [*_traced_inputs(gm, example_inputs), *self.flat_graph.state]
        decompositions = lowering_decompositions(bool(options.get("fallback_random")))
        fake_mode = _fake_mode(primals)
        try:
            signature, joint = _analyse_and_trace(self.flat_graph, example_inputs, primals, fake_mode, decompositions)
        except DynamicOutputShapeException:
            if fake_mode.shape_env is not None:
                raise
            # an op whose output size depends on data (nonzero in a boolean mask's backward) needs
            # symbolic sizes: trace again with a ShapeEnv (made only here: creating one is slow)
            fake_mode = FakeTensorMode(shape_env=ShapeEnv())
            signature, joint = _analyse_and_trace(self.flat_graph, example_inputs, primals, fake_mode, decompositions)
        signature = dataclasses.replace(signature, no_gradient=_no_gradient(joint, signature))
        num_forward = len(signature.differentiable)
        self.partition = partition(joint, len(primals), num_forward, recompute=recompute,
                                   unsaveable=signature.mutated)
        if enabled("aot"):
            log("aot", "partition: %d saved values, %d bytes\nforward:%s\nbackward:%s",
                self.partition.num_saved, self.partition.saved_bytes, self.partition.forward.code,
                self.partition.backward.code)
        forward = _compile_graph(self.partition.forward, detached(primals), options, inner)
        saved = self.partition.forward.graph.output_node().args[0][num_forward:]
        saved_all_tensors = all(isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)
                                for n in saved)
        super().__init__(signature, saved_all_tensors, self.flat_graph.state, forward, self._compile_backward_graph)

    def _compile_backward_graph(self, saved, tangents):
        return _compile_graph(self.partition.backward, [*saved, *tangents], self.options, self.inner)


def _no_gradient(joint, sig):
    """Inputs that require grad whose gradient the joint graph does not compute (None), and that the
    graph neither writes nor returns as themselves."""
    grads = joint.graph.output_node().args[0][len(sig.computed) + len(sig.mutated):]
    kept = set(sig.mutated) | {i for _, i, _ in sig.aliases}
    return tuple(i for i, g in zip(sig.grad_inputs, grads) if g is None and i not in kept)


def _analyse_and_trace(flat_graph, example_inputs, primals, fake_mode, decompositions):
    signature = analyse(flat_graph, example_inputs, primals, fake_mode, decompositions)
    return signature, trace_joint(flat_graph, signature, fake_mode, primals, decompositions)


def analyse(flat_graph, example_inputs, primals, fake_mode, decompositions):
    """The signature of `flat_graph` on `primals`: writes and aliases from the aot trace of the
    user graph on its example inputs (it sees writes hidden inside ops, such as batch norm's
    running stats, and reads symbolic sizes off the placeholders itself); requires_grad from a
    fake run with grad on."""
    num_inputs = len(example_inputs)
    aten_graph = trace_aten(flat_graph.gm, detached(example_inputs), decompositions)
    aliases = tuple((a.output_index, a.input_index, _alias_view(a, primals[a.input_index]))
                    for a in aten_graph.output_aliases)
    aliases = tuple(a for a in aliases if a[2] is not _COMPUTED)
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
    views = tuple((v.output_index, v.base_index, v.view, v.base_layout) for v in aten_graph.output_views)
    return GraphSignature(requires_grad, aten_graph.out_spec, aliases, computed,
                          tuple(flat[k].requires_grad for k in computed), mutated, differentiable, views)


_COMPUTED = object()


def _alias_view(alias, primal):
    """How an output that views input `primal` is rebuilt: as_strided of the input, or, on an
    input that requires grad and whose elements share memory (an expanded leaf), the view ops
    eager applied (as_strided's gradient would spread over the elements sharing a location);
    _COMPUTED where those ops are not known: the graph computes the output."""
    if alias.view is None or not (isinstance(primal, torch.Tensor) and primal.requires_grad
                                  and may_overlap_itself(primal)):
        return alias.view
    return ReplayedView(alias.ops) if alias.ops else _COMPUTED


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
        args = (*detached(fakes), *tangents)
        functional = _functionalize(with_autograd, args, decompositions)
        if _writes_intermediates(functional):
            # a decomposition applied during functionalization may itself write in place
            functional = _functionalize(functional, args, decompositions)
    _drop_input_write_backs(functional, sig.mutated)
    backward_rewrites.as_eager_on_cpu(functional)
    if enabled("aot"):
        log("aot", "joint graph:\n%s", functional.code)
    return functional


def _functionalize(gm, args, decompositions):
    # symbolic: decompositions applied here (clamp_'s, which broadcasts) see SymInts through the
    # Python dispatcher; C++ kernels would want concrete sizes
    with torch.no_grad(), fx_traceback.preserve_node_meta():
        return make_fx(torch.func.functionalize(meta_keeping(gm), remove="mutations"),
                       decomposition_table=decompositions, tracing_mode=tracing_mode(args))(*args)


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
    return forget_item_value(fake_mode.from_tensor(x.detach())).requires_grad_(x.requires_grad)
