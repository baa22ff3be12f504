"""Calling a backend someone else wrote the way torch.compile calls it.

A backend written for torch (`aot_module_simplified`, a partitioner of its own, a tracer that calls
`torch._guards.detect_fake_mode`) looks for the fake mode capture used in a
`torch._guards.TracingContext`, and takes a number input as the SymInt/SymFloat capture made for it.
Given a plain int and no context, AOT traces with a fake mode of its own, bakes the int's first
value into its graph, and kiln's guards (which only know kiln's symbols) never see that: every later
call with another value returned the first value's answer.

So a user backend runs inside a TracingContext holding the frame's fake mode, and each symbolic
number input is handed over as capture's SymInt (its hint is the value of this call). A fact the
backend learns about it (AOT specializing the int) is a guard on kiln's symbol in kiln's ShapeEnv,
which the frame's shape guards include: the entry recompiles instead of answering from stale code.
Tensor inputs stay real tensors (as torch passes them); the fake mode maps each back to the fake
capture made for it, so their symbolic sizes are kiln's symbols too. Each symbolic size is also an
input of its own, as in torch.compile, so a backend that traces on the real tensors cannot bake a
size in silently (size_inputs.py).

kiln's own backends are called as before: they build their own fake modes and read the graph's
placeholders, and a context found there would mix two modes' symbols.
"""
import torch
import torch._guards

from kiln.capture import size_inputs


def is_user_backend(backend):
    """Whether `backend` (a BoundBackend, or DDP's BucketSplitter around one) is one kiln does not
    ship (backends/builtin.py marks those)."""
    backend = getattr(backend, "backend", backend)
    fn = getattr(backend, "fn", backend)
    return not getattr(fn, "kiln_own", False)


def example_inputs(og, user):
    """The example inputs a backend gets for `og`'s graph (before size_inputs adds the sizes): each
    input's real value, except that a user backend gets a symbolic number input as capture's symbol
    (see the module docstring)."""
    values = []
    for _, value, node in og.inputs:
        example = node.meta.get("example_value")
        if user and not isinstance(value, torch.Tensor) and \
                isinstance(example, (torch.SymInt, torch.SymFloat)):
            value = example
        values.append(value)
    return values


def compile_graph(backend, gm, og):
    """backend(gm, example inputs) for a user backend, called as torch.compile calls it: in a
    TracingContext with capture's fake mode, number inputs as capture's symbols, and each symbolic
    size an input of its own (size_inputs.py). Returns what kiln's glue calls."""
    examples = example_inputs(og, True)
    lifted = size_inputs.lift(gm, examples)
    if lifted is not None:
        gm, examples, wrap = lifted
    with torch._guards.tracing(torch._guards.TracingContext(og.fake_mode)):
        compiled = backend(gm, examples)
    return compiled if lifted is None else wrap(compiled)
