"""memory_plan.release_after: the wrapper drops each intermediate after its last reader (so the
allocator hands its memory to the next step), never one that a later step or the result needs."""
import re

import torch
import torch.nn.functional as F

from tests.compiler.test_compile_fx import check


def wrapper_lines(c):
    return c.kiln_wrapper.splitlines()


def test_intermediates_are_dropped_before_the_next_convolution():
    def f(x, w):
        y = torch.relu(F.conv2d(x, w, padding=1))
        z = torch.relu(F.conv2d(y, w, padding=1))
        return F.conv2d(z, w, padding=1) + 1
    c = check(f, torch.randn(1, 4, 12, 12), torch.randn(4, 4, 3, 3), layout_optimization=False)
    lines = wrapper_lines(c)
    calls = [k for k, line in enumerate(lines) if "aten_" in line]
    dels = [k for k, line in enumerate(lines) if line.strip().startswith("del ")]
    assert len(calls) == 3 and any(calls[0] < k < calls[2] for k in dels), c.kiln_wrapper


def test_extern_without_results_then_more_work():
    # linalg.inv checks its factorization with an aten call that returns nothing
    def f(a, b):
        return torch.linalg.inv(a) + 1, torch.linalg.solve(a, b), (a * 2).sum()
    a = torch.randn(4, 4) + 4 * torch.eye(4)
    c = check(f, a, torch.randn(4, 2), rtol=1e-4, atol=1e-4)
    deleted = [n for line in wrapper_lines(c) if line.strip().startswith("del ")
               for n in re.split(r",\s*", line.strip()[4:])]
    assert len(deleted) == len(set(deleted)), c.kiln_wrapper  # each name dropped once


def test_value_read_by_a_later_step_and_returned_survives():
    def f(x, w):
        y = F.conv2d(x, w, padding=1)
        z = torch.sigmoid(y) * 3
        return y, F.conv2d(z, w, padding=1) - y
    check(f, torch.randn(2, 3, 9, 9), torch.randn(3, 3, 3, 3), rtol=1e-4, atol=1e-4)
