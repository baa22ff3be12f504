"""torch.utils.checkpoint inside a compiled region: gradients equal eager's, and the checkpointed
function's activations are recomputed in backward (its compiled graph runs again there)."""
import copy
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import kiln
from tests.utils import CompileCounter


class Block(torch.nn.Module):
    def __init__(self, use_reentrant):
        super().__init__()
        self.pre, self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        self.use_reentrant = use_reentrant

    def inner(self, x):
        return torch.tanh(self.b(torch.relu(self.a(x))))

    def forward(self, x):
        # (the reentrant form needs an input that requires grad to produce gradients at all)
        return checkpoint(self.inner, self.pre(x), use_reentrant=self.use_reentrant) + x


class CallCounter(CompileCounter):
    """Counts graphs, and how often each compiled graph runs."""

    def __init__(self):
        super().__init__()
        self.runs = []

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        index = len(self.runs)
        self.runs.append(0)

        def run(*args):
            self.runs[index] += 1
            return gm.forward(*args)
        return run


def _train(model, run, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
        run(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_checkpointed_block_trains_as_eager(use_reentrant, backend):
    torch.manual_seed(0)
    eager = Block(use_reentrant)
    model = copy.deepcopy(eager)
    expected = _train(eager, eager)
    actual = _train(model, kiln.compile(model, backend=backend))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_checkpointed_function_in_a_function():
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)

    def f(x):
        y = checkpoint(lambda t: (t @ w).sin().cos(), x.exp(), use_reentrant=False)
        return y.sum()
    x = torch.randn(3, 8)
    f(x).backward()
    expected, w.grad = w.grad, None
    kiln.compile(f, backend="aot_eager")(x).backward()
    torch.testing.assert_close(w.grad, expected)


@pytest.mark.kiln_only  # torch.compile traces the function into the surrounding graph instead
def test_checkpointed_function_is_compiled_and_recomputed_in_backward():
    torch.manual_seed(0)
    model = Block(use_reentrant=False)
    counter = CallCounter()
    _train(model, kiln.compile(model, backend=counter), steps=1)
    # the graph before the checkpoint, the checkpointed function's, the one after it
    assert counter.frame_count == 3
    inner = next(i for i, g in enumerate(counter.graphs) if "tanh" in g.code)
    assert counter.runs[inner] == 2  # forward, then the recomputation in backward


_WARM_PROGRAM = textwrap.dedent("""
    import torch, kiln
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    def block(x):
        return torch.tanh(lin(x)) * 2
    def step(x):
        return checkpoint(block, x, use_reentrant=False).sum()
    x = torch.randn(3, 8, requires_grad=True)
    kiln.compile(step, backend="{backend}")(x).backward()
    compiled_grad, x.grad = x.grad.clone(), None
    step(x).backward()
    torch.testing.assert_close(compiled_grad, x.grad)
    print("same gradients")
""")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_checkpointed_function_loaded_from_the_capture_cache(tmp_path, backend):
    # a fresh process loads the checkpointed function's entry from disk and compiles its graph under
    # checkpoint's saved-tensor hooks: they must be hidden there too (aot traced real tensors through
    # them: "Please convert all Tensors to FakeTensors")
    program = tmp_path / "program.py"
    program.write_text(_WARM_PROGRAM.format(backend=backend))
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    env.pop("KILN_CAPTURE_CACHE", None)
    for _ in range(2):  # cold, then warm
        done = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "same gradients" in done.stdout, done.stderr[-3000:]
