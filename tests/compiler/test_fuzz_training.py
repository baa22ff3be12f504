"""Differential fuzzing of kiln's training path: the random programs of test_fuzz_programs.py, their
float32/float64 inputs requiring grad, one backward; eager vs kiln, outputs and gradients.

A program is a training program when it is one in eager: its inputs can require grad (eager refuses
an in-place write into a leaf that requires grad, or a view of one) and some output has a gradient
history. Programs that read extreme or special (NaN, inf) inputs are left out: their gradients are
NaN or inf where the order of operations decides which. The loss weights each differentiable
output by a fixed random tensor on the generator's grid (the same for eager, kiln and the
reference), so every element of every output gets its own cotangent.

Outputs are compared as test_fuzz_programs compares them. Gradients are sums of products: they are
compared within a tolerance scaled by their magnitude, or where not, kiln's gradient must be no
further from the gradient of the float64 reference run (the same program on float64 copies,
test_fuzz_programs' Reference) than eager's is. A batch is compiled with static shapes (two calls)
or dynamic=True (calls at the programs' sizes, at other sizes, at the programs' again: at other
sizes a gradient is compared only when every output of its program is smooth).

KILN_FUZZ_TRAIN_N programs (default 12), from KILN_FUZZ_TRAIN_SEED0; long runs:
`python -m tests.compiler.fuzz_driver --check tests.compiler.test_fuzz_training:check_seeds
--shapes static|dynamic --seed0 S --n N`.
"""
import dataclasses
import os
import warnings

import pytest
import torch

import kiln
from tests.compiler import test_fuzz_programs as fuzz

N_PROGRAMS = int(os.environ.get("KILN_FUZZ_TRAIN_N", "12"))
SEED0 = int(os.environ.get("KILN_FUZZ_TRAIN_SEED0", "0"))
BATCH = 6
GRAD_TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-7, 1e-7)}
CALLS = {"static": ("same", "same"), "dynamic": ("same", "other", "same")}


@dataclasses.dataclass
class Run:
    """One run of a batch: its outputs, its inputs after the call, and the gradient of the loss
    with respect to each input that requires grad (None where an input does not)."""
    outputs: list
    inputs: list
    grads: list


def learnable(spec):
    return spec.layout != "alias" and spec.dtype in fuzz.FLOAT_DTYPES and spec.kind == "grid"


def make_leaves(specs, wide=False):
    """The inputs of `specs` (fuzz.make_inputs); each learnable one a leaf that requires grad."""
    inputs = fuzz.make_inputs(specs, wide)
    for spec, x in zip(specs, inputs):
        if learnable(spec):
            x.requires_grad_(True)
    return inputs


def cotangent(seed, out):
    """The fixed weights of output `out` in the loss: values on a grid, seeded by position."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-8, 9, out.shape, generator=g).to(torch.float64) / 4).to(out.dtype)


def run(fn, specs, seed, wide=False):
    """Run `fn` on fresh inputs of `specs` and backward through the weighted sum of its outputs."""
    inputs = make_leaves(specs, wide)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outputs = list(fn(*inputs))
    loss = sum((o * cotangent(seed + k, o)).sum().double() for k, o in enumerate(outputs)
               if isinstance(o, torch.Tensor) and o.requires_grad)
    leaves = [x for x in inputs if x.requires_grad and x.is_leaf]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True) if leaves else ()
    found = iter(grads)
    grads = [next(found) if x.requires_grad and x.is_leaf else None for x in inputs]
    return Run([o.detach() for o in outputs], [x.detach() for x in inputs], grads)


def is_training_program(p):
    """Whether `p` runs forward and backward in eager with its inputs requiring grad, and some
    input gets a gradient."""
    if p.special or any(s.kind in ("special", "extreme") for s in p.inputs) or not any(map(learnable, p.inputs)):
        return False
    fn, _ = fuzz.batch_function([p])
    try:
        return any(g is not None for g in run(fn, p.inputs, p.seed).grads)
    except Exception:  # noqa: BLE001 - eager refuses it with grad: an in-place write into a leaf or
        return False   # into a value the backward needs, an op without a derivative


def training_programs(seeds):
    programs = (fuzz.program(s, prefix=f"p{s}_") for s in seeds)
    return [p for p in programs if is_training_program(p)]


def reference_grads(programs, specs, seed):
    """The float64 reference run's gradients (fuzz.reference_run's rule: None for each input of a
    program that is not valid eager code in float64)."""
    grads, at = [], 0
    for p in programs:
        mine, at = specs[at:at + len(p.inputs)], at + len(p.inputs)
        fn, _ = fuzz.batch_function([p], fuzz.ACCURATE_F)
        try:
            grads += run(fn, mine, seed + programs.index(p) * 1000, wide=True).grads
        except Exception:  # noqa: BLE001 - any refusal: no reference, the comparison stays strict
            grads += [None] * len(mine)
    return grads


def check_programs(programs, shapes):
    """Run `programs` eagerly and through kiln with inputs requiring grad; raise AssertionError
    naming what differs."""
    fn, src = fuzz.batch_function(programs)
    specs = {"same": [s for p in programs for s in p.inputs]}
    if shapes != "static":
        specs["other"] = [s for p in programs for s in fuzz.resized(p)]
    seed = programs[0].seed
    eager = {which: run(fn, call_specs, seed) for which, call_specs in specs.items()}
    kiln.reset()
    compiled = kiln.compile(fn, options={"debug": True}, dynamic=True if shapes == "dynamic" else None)
    for which in CALLS[shapes]:
        try:
            actual = run(compiled, specs[which], seed)
        except Exception as e:
            raise AssertionError(f"kiln raised {type(e).__name__} (call at {which} sizes): {e}\n{src}") from e
        expected = eager[which]
        compare = fuzz.compare_all if which == "same" else fuzz.compare_smooth
        compare(programs, actual.outputs, expected.outputs, actual.inputs, expected.inputs, src)
        compare_grads(programs, specs[which], actual.grads, expected.grads,
                      reference_grads(programs, specs[which], seed), which, src)


def compare_grads(programs, specs, actual, expected, reference, which, src):
    owner = [p for p in programs for _ in p.inputs]
    for spec, p, a, b, r in zip(specs, owner, actual, expected, reference):
        what = f"gradient of {spec.name} ({which} sizes)"
        if b is None:
            assert a is None, f"{what}: kiln has one, eager none\n{src}"
            continue
        assert a is not None, f"{what}: eager has one, kiln none\n{src}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{what}: {a.dtype}{tuple(a.shape)} != " \
                                                         f"{b.dtype}{tuple(b.shape)}\n{src}"
        if which != "same" and not all(n in p.smooth for n, _ in p.outputs):
            continue
        rtol, atol = GRAD_TOLERANCE[b.dtype]
        scale = max(1.0, float(b.abs().nan_to_num(0, 0, 0).max())) if b.numel() else 1.0
        fuzz.assert_within(a, b, (rtol, atol * scale), r, what, src)


def check_seeds(seeds, shapes):
    """fuzz_driver's check: [(seed, message)] for the training programs of `seeds` that fail."""
    programs = training_programs(seeds)
    if not programs:
        return []
    shapes = shapes if shapes in CALLS else "static"
    try:
        check_programs(programs, shapes)
        return []
    except AssertionError as batch_error:
        alone = []
        for p in programs:
            try:
                check_programs([p], shapes)
            except AssertionError as e:
                alone.append((p.seed, str(e)))
        return alone or [(seeds[0], f"the batch fails, no program alone does: {batch_error}")]


BATCHES = [list(range(SEED0 + k, min(SEED0 + k + BATCH, SEED0 + N_PROGRAMS))) for k in range(0, N_PROGRAMS, BATCH)]


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
@pytest.mark.parametrize("seeds", BATCHES, ids=lambda s: f"seeds{s[0]}-{s[-1]}")
def test_random_programs_train_as_in_eager(seeds, shapes):
    failures = check_seeds(seeds, shapes)
    assert not failures, "\n\n".join(f"seed {s} ({shapes}):\n{msg}" for s, msg in failures[:3])


def test_a_program_that_writes_into_an_input_is_not_a_training_program():
    p = fuzz.Program(0, [fuzz.InputSpec("a", (3,), torch.float32, "contiguous", "grid", 1)],
                     ["a.mul_(2)", "t = a + 1"], [("t", (1e-4, 1e-4))])
    assert not is_training_program(p)
    q = dataclasses.replace(p, lines=["t = a * 2"])
    assert is_training_program(q)
