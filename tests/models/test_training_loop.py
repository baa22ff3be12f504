"""A whole small training loop in one compiled function: forward, loss, backward, optimizer step,
metrics in a Python dict, early stop on a loss value. Every piece of state equals eager's."""
import copy

import torch
from torch import nn

import kiln
from tests.utils import CompileCounter, assert_equal_state


def fit(model, opt, batches, history, patience=2):
    best, stale = float("inf"), 0
    for step, (x, y) in enumerate(batches):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        history.setdefault("loss", []).append(round(value, 4))
        if value < best - 1e-3:
            best, stale = value, 0
        else:
            stale += 1
        if stale >= patience:
            history["stopped_at"] = step
            break
    return best


def test_training_loop_state_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    eager_model = copy.deepcopy(model)
    batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(6)]
    eager_history, history = {}, {}
    eager_best = fit(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.05), batches, eager_history)
    best = kiln.compile(fit, backend=CompileCounter())(model, torch.optim.SGD(model.parameters(), lr=0.05),
                                                       batches, history)
    assert best == eager_best
    assert_equal_state(history, eager_history)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q)
