"""Zero-argument super() after a graph break: the resume function must take the method's first
argument first, though no instruction after the break names it (super() reads it implicitly)."""
import torch

import kiln
from tests.utils import CompileCounter


class Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


@kiln.disable
def note(i):
    """A call capture cannot follow."""


class AfterBranch(Base):
    def forward(self, x):
        if x.mean() > 0:  # a break on a tensor's value: the rest runs in a resume function
            x = x * 2
        return super().forward(x)


class InLoopAfterBranch(Base):
    def forward(self, x, n: int):
        if x.mean() > 0:
            x = x * 2
        for i in range(n):  # a break inside this loop: the resume function itself runs eagerly
            x = super().forward(x)
            note(i)
        return x


def _matches_eager_on_both_branches(model, backend, *extra):
    compiled = kiln.compile(model, backend=backend)
    for sign in (1, -1):  # both sides of the branch: two resume functions
        x = sign * torch.ones(2, 4)
        torch.testing.assert_close(compiled(x, *extra), model(x, *extra))


def test_super_in_a_resume_function():
    torch.manual_seed(0)
    counter = CompileCounter()
    _matches_eager_on_both_branches(AfterBranch(), counter)
    assert counter.frame_count >= 2


def test_super_in_a_resume_function_that_runs_eagerly():
    torch.manual_seed(0)
    _matches_eager_on_both_branches(InLoopAfterBranch(), "eager", 2)
