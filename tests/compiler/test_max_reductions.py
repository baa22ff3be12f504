"""Float max/min reductions (codegen: kiln_max_acc/kiln_min_acc, the accumulator's update) give eager's
answers where NaN, +-inf and +-0 meet, in rows and columns, in the vectorized loop and its remainder,
and their row loop vectorizes (gcc's report, as test_vectorized)."""
import math

import pytest
import torch

import kiln
from kiln.compiler import compile_fx
from tests.compiler.test_vectorized import vectorized_lines

SPECIAL = (math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 3e38, -3e38)

REDUCTIONS = {
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(-1),
    "max_dim0": lambda x: x.amax(0),
    "min_dim0": lambda x: x.amin(0),
    "max_all": lambda x: x.max(),
    "softmax": lambda x: torch.softmax(x, -1),
}


def rows(width):
    """Rows of `width` that hold each special value (alone, and beside each other one) at the start,
    middle and end, over a random background; plus rows of nothing but one special value."""
    g = torch.Generator().manual_seed(0)
    out = []
    for a in SPECIAL:
        for b in SPECIAL:
            for pos in (0, width // 2, width - 1):
                r = torch.randn(width, generator=g)
                r[pos] = a
                r[(pos + 7) % width] = b
                out.append(r)
        out.append(torch.full((width,), a))
    return torch.stack(out)


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("width", (37, 64))
def test_max_and_min_reductions_match_eager_at_special_values(name, width):
    fn = REDUCTIONS[name]
    x = rows(width)
    got, want = kiln.compile(fn, options={"graph_cache": False}, dynamic=False)(x), fn(x)
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0 if name != "softmax" else 1e-6, atol=0)
    if name != "softmax":  # the sign of a zero maximum, as eager's
        assert torch.equal(torch.signbit(got[~got.isnan()]), torch.signbit(want[~want.isnan()]))


def test_a_max_row_reduction_vectorizes(tmp_path):
    x = torch.randn(64, 512)
    compiled = compile_fx(torch.fx.symbolic_trace(lambda x: x.amax(-1) + x.amin(-1)), [x],
                          {"graph_cache": False, "debug_bounds_checks": False})
    torch.testing.assert_close(compiled(x), x.amax(-1) + x.amin(-1))
    lines = compiled.kiln_source.splitlines()
    loops = [i + 1 for i, line in enumerate(lines) if "for (int64_t r0 = 0;" in line]
    assert loops
    vectorized = vectorized_lines(compiled.kiln_source, tmp_path)
    assert all(vectorized & {loop, loop + 1} for loop in loops), (loops, sorted(vectorized))
