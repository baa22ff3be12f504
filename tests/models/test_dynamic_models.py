"""Models over 10 sequence lengths with dynamic=None: at most two compiles (static, then symbolic
sequence length), and every length equal to eager — through the capture-only counting backend and
through kiln's default backend "inductor" (which runs symbolic graphs too)."""
import os
import re

import pytest
import torch

import kiln
from tests.utils import CompileCounter

LENGTHS = (8, 5, 11, 16, 7, 23, 30, 9, 13, 40)


class CountingBackend(CompileCounter):
    """Counts graphs like CompileCounter but compiles each one with a real backend."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.compiled = []

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        self.compiled.append(self.inner(gm, example_inputs))
        return self.compiled[-1]


def counting(backend):
    if backend == "eager":
        return CompileCounter()
    if os.environ.get("KILN_TEST_PEER") == "torch":
        from torch._dynamo.testing import CompileCounterWithBackend
        return CompileCounterWithBackend(backend)
    from kiln.backends.registry import lookup_backend
    return CountingBackend(lookup_backend(backend))


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 16)).eval()


def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


def mlp_inputs(length):
    return {"input": torch.randn(2, length, 16, generator=torch.Generator().manual_seed(length))}


def gpt2_inputs(length):
    ids = torch.randint(0, 100, (2, length), generator=torch.Generator().manual_seed(length))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


PEER = os.environ.get("KILN_TEST_PEER") == "torch"


def first(out):
    return out if isinstance(out, torch.Tensor) else out[0]


CASES = [pytest.param(mlp, mlp_inputs, "eager", id="mlp-eager"),
         pytest.param(mlp, mlp_inputs, "inductor", id="mlp-inductor"),
         pytest.param(gpt2, gpt2_inputs, "eager", id="gpt2-eager"),
         pytest.param(gpt2, gpt2_inputs, "inductor", id="gpt2-inductor")]


def run_lengths(build, inputs, backend):
    """Compiled vs eager at every length; returns the number of graphs compiled."""
    model = build()
    counter = counting(backend)
    compiled = kiln.compile(model, backend=counter)
    with torch.no_grad():
        for length in LENGTHS:
            kwargs = inputs(length)
            torch.testing.assert_close(first(compiled(**kwargs)), first(model(**kwargs)), rtol=1e-4, atol=1e-5)
    for graph in getattr(counter, "compiled", ()):  # kiln's compiler compiled the symbolic graph too
        assert "<whole graph>" not in graph.kiln_fallbacks
    return counter.frame_count


@pytest.mark.parametrize("build, inputs, backend", CASES)
def test_ten_sequence_lengths_equal_eager_in_at_most_two_compiles(build, inputs, backend):
    assert run_lengths(build, inputs, backend) <= 2


@pytest.mark.skipif(PEER, reason="inspects kiln's compiled graphs")
def test_mlp_symbolic_graph_runs_fused_kernels():
    """The recompile at the second length is symbolic, and still one GELU+LayerNorm kernel."""
    counter = counting("inductor")
    compiled = kiln.compile(mlp(), backend=counter)
    with torch.no_grad():
        for length in LENGTHS[:4]:
            compiled(**mlp_inputs(length))
    symbolic = counter.compiled[-1]
    # the wrapper reads the length from its inputs and sizes the kernels' launches with it (C++ or
    # Triton); this counting backend is a user's, so the length is an input of its own (as torch
    # hands a backend each size), not read off a tensor's size()
    assert counter.frame_count == 2 and re.search(r"\bs\d+ = arg\d+\n", symbolic.kiln_wrapper)
    assert len(symbolic.kiln_kernels) == len(counter.compiled[0].kiln_kernels)


