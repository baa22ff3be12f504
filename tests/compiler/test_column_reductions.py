"""Reductions over a leading dim (kiln/compiler/codegen/cpp_columns.py): blocks of output columns
with accumulator arrays, the reduction loop outside a vectorized column loop. Eager is the oracle;
each case also checks that the column loop nest was the one generated."""
import pytest
import torch

import kiln
from kiln.compiler import compile_fx
from kiln.compiler.codegen.cpp_columns import BLOCK
from kiln.config import compiler_options

COLUMN_LOOP = f"b += {BLOCK})"


def compiled(fn, *args, **options):
    return compile_fx(torch.fx.symbolic_trace(fn), list(args), compiler_options(options=options or None))


def check(fn, *args, columns=True, rtol=1e-5, atol=1e-5, **options):
    c = compiled(fn, *args, **options)
    torch.testing.assert_close(c(*args), fn(*args), rtol=rtol, atol=atol, equal_nan=True)
    assert not c.kiln_fallbacks
    assert (COLUMN_LOOP in c.kiln_source) == columns
    return c


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.rand(*shape, generator=g) > 0.5
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


# sizes around the block: fewer columns than a block, a ragged last block, several blocks; rows
# short and long enough to accumulate in double
@pytest.mark.parametrize("shape", [(3, 9), (7, 64), (33, 65), (512, 1000), (5000, 130)])
@pytest.mark.parametrize("op", ["sum", "amax", "amin", "prod", "mean"])
def test_leading_dim_reductions(shape, op):
    x = rand(*shape) * (0.1 if op == "prod" else 1)
    check(lambda x: getattr(torch, op)(x, 0), x, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.bool, torch.float16,
                                   torch.bfloat16])
def test_dtypes(dtype):
    x = rand(300, 70, dtype=dtype)
    if dtype == torch.bool:
        check(lambda x: torch.any(x, 0), x)
        check(lambda x: torch.all(x, 0), x)
    check(lambda x: x.sum(0), x, rtol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5)


def test_prologue_and_epilogue_fuse():
    # a bias gradient through relu, scaled after the sum: one kernel
    c = check(lambda x, y: ((x.relu() * y).sum(0, keepdim=True) / 7 + 1).sigmoid(),
              rand(257, 130), rand(257, 130, seed=1))
    assert len(c.kiln_kernels) == 1


def test_middle_dim_of_three():
    check(lambda x: x.sum(1), rand(16, 256, 100))
    # two reductions in one loop, then their difference per point
    check(lambda x: x.amax(1, keepdim=True) - x.mean(1, keepdim=True), rand(4, 50, 33))


def test_nan_and_inf_propagate_as_in_eager():
    x = rand(100, 80)
    x[3, 5], x[7, 9], x[11, 10] = float("nan"), float("inf"), -float("inf")
    x[:, 20] = float("nan")
    check(lambda x: x.amax(0), x)
    check(lambda x: x.amin(0), x)
    check(lambda x: x.sum(0), x)


def test_non_contiguous_inputs():
    base = rand(200, 300)
    check(lambda x: x.sum(0), base[:, ::2])
    check(lambda x: x.sum(0), base[10:150, 5:260])
    # the transposed input makes the reduced dim contiguous: the plain loop nest is better
    check(lambda x: x.sum(0), base.t(), columns=False)


def test_serial_and_parallel():
    x = rand(64, 96)
    check(lambda x: x.sum(0), x, **{"cpp.min_parallel_work": 1})
    check(lambda x: x.sum(0), x, **{"cpp.min_parallel_work": 10**9})


def test_symbolic_sizes():
    fn = lambda x: (x * 2).sum(0)  # noqa: E731
    compiled_fn = kiln.compile(fn, dynamic=True)
    for rows, cols in [(5, 7), (40, 130), (300, 65), (17, 1000)]:
        x = rand(rows, cols, seed=rows)
        torch.testing.assert_close(compiled_fn(x), fn(x))


def test_bias_gradient_in_a_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    ref.load_state_dict(model.state_dict())
    x = rand(200, 32)
    kiln.compile(model)(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_norm_weight_gradient_pattern():
    # sum over rows of grad * (x - mean[row]) * rstd[row]: per-row values do not decide the loop order
    def fn(g, x, mean, rstd):
        return (g * (x - mean[:, None]) * rstd[:, None]).sum(0)
    check(fn, rand(300, 96), rand(300, 96, seed=1), rand(300, seed=2), rand(300, seed=3).abs())
