"""Generated pointwise loops must vectorize: a scalar loop is correct but several times slower (a
-0.0 check written with || once kept gcc from vectorizing every loop that calls tanh or erf).
Checked through gcc's own report (-fopt-info-vec) on the source kiln generated, with kiln's flags."""
import os
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from kiln.compiler import build, compile_fx
from kiln.compiler.codegen import cpp

OPS = {
    "tanh": torch.tanh, "erf": torch.erf, "exp": torch.exp, "sigmoid": torch.sigmoid,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "relu_sqrt": lambda x: torch.sqrt(torch.relu(x) + 1), "abs_max": lambda x: torch.maximum(x.abs(), x * 0.5),
    "where": lambda x: torch.where(x > 0, x, x * 0.1), "log1p": lambda x: torch.log1p(x.abs()),
    "chain": lambda x: torch.tanh(torch.sqrt(torch.relu(torch.sigmoid(x + 0.5) ** 2 - 0.25) + 1.0) * 2.0),
}


def vectorized_lines(source, tmp_path):
    """Line numbers gcc reports as vectorized loops in `source`."""
    path = tmp_path / "kernel.cpp"
    path.write_text(source)
    flags = [f for f in build.BASE_FLAGS + cpp.LINK_FLAGS if f not in ("-shared", "-lmvec")]
    done = subprocess.run([os.environ.get("CXX", "g++"), *flags, "-c", str(path), "-o", str(tmp_path / "k.o"),
                           "-fopt-info-vec-optimized"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {int(m.group(1)) for m in re.finditer(r"kernel\.cpp:(\d+):\d+: optimized: loop vectorized", done.stderr)}


@pytest.mark.parametrize("name", sorted(OPS))
def test_pointwise_loop_vectorizes(name, tmp_path):
    fn = OPS[name]
    x = torch.randn(256, 512)
    # the loops kiln ships: a bounds-checked store (KILN_BOUNDS_CHECK=1) is a branch gcc leaves scalar
    options = {"graph_cache": False, "debug_bounds_checks": False}
    compiled = compile_fx(torch.fx.symbolic_trace(lambda x: fn(x * 1.5) + 1), [x], options)
    torch.testing.assert_close(compiled(x), fn(x * 1.5) + 1)
    lines = compiled.kiln_source.splitlines()
    loop = next(i + 1 for i, line in enumerate(lines) if "for (int64_t x0 = c0;" in line)  # the simd loop
    # gcc names the loop by its header or its first statement
    assert vectorized_lines(compiled.kiln_source, tmp_path) & {loop, loop + 1}


@pytest.mark.parametrize("window", [None, 8])
def test_masked_softmax_rows_vectorize(window, tmp_path):
    """Attention's masked softmax: a bool mask (an input, or computed from positions) beside float
    math. Every row loop of the kernel must vectorize: a `bool` load kept gcc 12 from vectorizing
    any loop it was in (the rows ran scalar, 4x slower)."""
    def fn(scores, keep):
        n = scores.shape[-1]
        pos = torch.arange(n)
        if window is not None:
            keep = keep & (pos[None, :] > pos[:, None] - window) & (pos[None, :] <= pos[:, None])
        return torch.softmax(torch.tanh(scores / 50.0) * 50.0 + torch.where(keep, 0.0, torch.finfo(torch.float32).min), -1)
    scores, keep = torch.randn(2, 4, 64, 64), torch.rand(2, 1, 1, 64) > 0.2
    compiled = compile_fx(torch.fx.symbolic_trace(fn), [scores, keep], {"graph_cache": False})
    torch.testing.assert_close(compiled(scores, keep), fn(scores, keep))
    lines = compiled.kiln_source.splitlines()
    loops = [i + 1 for i, line in enumerate(lines) if "for (int64_t r0 = 0;" in line]
    assert len(loops) >= 2
    vectorized = vectorized_lines(compiled.kiln_source, tmp_path)
    assert all(vectorized & {loop, loop + 1} for loop in loops), (loops, sorted(vectorized))
