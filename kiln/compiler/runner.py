"""Running a compiled aten graph in the torch graph's calling convention (`make_runner`): mutated
inputs and module tensors written back, aliased outputs rebuilt, the output structure restored.
What aot records about a graph for that (`AtenGraph`, `OutputAlias`, `OutputView`) lives here too,
apart from the tracing in aot.py, so a graph loaded from the graph cache runs without importing
make_fx, fake tensors or sympy."""
import dataclasses
import operator

import torch
import torch.utils._pytree as pytree


@dataclasses.dataclass
class OutputAlias:
    """A user output that eager returns as an input or a view of one."""
    output_index: int    # position among the flat user outputs
    input_index: int     # the input it aliases
    view: tuple | None   # (size, stride, storage_offset) to as_strided the input; None: the input itself
    ops: tuple = ()      # the view ops eager applied, ((op, args, kwargs), ...) after the input, where
                         # their arguments are constants: training replays them on an input whose
                         # elements share memory (see training_runtime.ReplayedView)


@dataclasses.dataclass
class OutputView:
    """A user output that eager returns as a view of another user output (`t` and `t[:, 1:]`): the
    runner rebuilds it from that output, so an in-place op on one (after a graph break) shows in
    the other, as in eager."""
    output_index: int
    base_index: int      # the user output it views
    view: tuple          # (size, stride, storage_offset) on the base's storage
    base_layout: tuple   # (stride, storage_offset) the base must have when it runs for `view` to hold


@dataclasses.dataclass
class AtenGraph:
    gm: torch.fx.GraphModule      # functional aten graph (no in-place ops, no mutation);
                                  # placeholders = the flat inputs in order;
                                  # outputs = a flat tuple: user outputs, then new values of mutated
                                  # inputs, then new values of mutated module tensors
    num_user_outputs: int
    mutated_inputs: list          # indices of inputs whose new values follow the user outputs, in order
    out_spec: pytree.TreeSpec     # rebuilds the user output structure from the flat user outputs
    mutated_attrs: list = dataclasses.field(default_factory=list)
    # ^ parameters/buffers of the torch graph (the tensors themselves) whose new values follow
    #   the mutated inputs' values, in order
    output_aliases: list = dataclasses.field(default_factory=list)  # OutputAlias, for make_runner
    output_views: list = dataclasses.field(default_factory=list)    # OutputView, for make_runner


def _write_back(pairs):
    """Copy each new value into its target. A new value may be a view of a mutated input (the
    graph may return `x.t()` as x's new value, or y's old value as x's): such values are cloned
    first, so no write reads memory that another write already changed."""
    targets = {t.untyped_storage().data_ptr() for t, _ in pairs}
    staged = [(t, v.clone() if v is not t and v.untyped_storage().data_ptr() in targets else v)
              for t, v in pairs]
    for target, value in staged:
        if value is not target:
            target.copy_(value)


def rebuilder(spec):
    """flat user outputs (a list or tuple) -> their structure; the common shapes skip pytree (a microsecond a call)."""
    if spec.is_leaf():
        return operator.itemgetter(0)
    if spec.type is tuple and all(spec.child(i).is_leaf() for i in range(spec.num_children)):
        return tuple
    return lambda flat: pytree.tree_unflatten(list(flat), spec)


def make_runner(aten: AtenGraph, flat_fn):
    """Wrap `flat_fn` (inputs -> flat outputs of `aten.gm`) into the torch graph's calling
    convention: mutated inputs and module tensors are written back, aliased outputs are rebuilt
    from their inputs, and the user outputs come back in their original structure."""
    n_user = aten.num_user_outputs
    input_writes = [(i, n_user + k) for k, i in enumerate(aten.mutated_inputs)]
    attr_writes = [(t, n_user + len(input_writes) + k) for k, t in enumerate(aten.mutated_attrs)]
    aliases = [(a.output_index, a.input_index, a.view) for a in aten.output_aliases]
    views = [(v.output_index, v.base_index, v.view, v.base_layout) for v in aten.output_views]
    rebuild = rebuilder(aten.out_spec)

    def run(*args):
        outs = flat_fn(*args)
        if input_writes or attr_writes:
            _write_back([(args[i], outs[k]) for i, k in input_writes] +
                        [(tensor, outs[k]) for tensor, k in attr_writes])
        user = list(outs[:n_user])
        for k, i, view in aliases:
            user[k] = args[i] if view is None else args[i].as_strided(*view)
        for k, j, view, base_layout in views:
            base = user[j]
            if (base.stride(), base.storage_offset()) == base_layout:
                user[k] = base.as_strided(*view)
        return rebuild(user)

    # The compiler's inspection attributes (kiln_kernels, ...) stay visible on the wrapper,
    # next to the aten graph they were compiled from.
    for name in dir(flat_fn):
        if name.startswith("kiln_"):
            setattr(run, name, getattr(flat_fn, name))
    run.kiln_aten = aten
    run.kiln_mutated_inputs = tuple(aten.mutated_inputs)  # assumed to share memory with no other input
    return run


def mutated_inputs_alias(args, mutated):
    """Whether an input in `mutated` (positions) shares storage with another tensor input."""
    storages = {}
    for i, x in enumerate(args):
        if isinstance(x, torch.Tensor):
            storages.setdefault(x.untyped_storage().data_ptr(), []).append(i)
    return any(len(storages[args[i].untyped_storage().data_ptr()]) > 1 for i in mutated)


def fix_layout(t, size, stride):
    """An extern result with the layout kernels were compiled for (aten almost always agrees); the
    generated wrappers call it (here, not in wrapper.py, so a cached wrapper loads without sympy)."""
    if t.stride() == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
