"""freezing=True: module parameters and buffers as constants of an inference graph (batch norms
folded into convolutions, weights prepacked), against eager: results, module state, and weights
changed after compiling."""
import pytest
import torch
from torch import nn

import kiln
from tests.compiler.vision_helpers import Recorder, check_module, conv_bn, randomize_norms
from tests.utils import assert_equal_state


def small_net(act=nn.ReLU):
    torch.manual_seed(0)
    return randomize_norms(nn.Sequential(conv_bn(3, 8, act=act), conv_bn(8, 8, groups=8, act=act),
                                         conv_bn(8, 16, kernel=1, act=None), nn.AdaptiveAvgPool2d(1),
                                         nn.Flatten(), nn.Linear(16, 5))).eval()


def aten_targets(recorder):
    """The ops of the frozen aten graphs kiln compiled (their names)."""
    return {str(n.target) for fn in recorder.compiled for gm in [fn.kiln_frozen_graph]
            for n in gm.graph.nodes if n.op == "call_function"}


def test_frozen_conv_bn_net_matches_eager_and_folds_batch_norm():
    model = small_net()
    recorder = check_module(model, torch.randn(2, 3, 16, 16), freezing=True)
    targets = aten_targets(recorder)
    assert not any("batch_norm" in t for t in targets), targets  # folded into the convolutions


def test_activations_fused_into_prepacked_convolutions_match_eager():
    for act in (nn.ReLU6, nn.SiLU, nn.Hardswish, nn.GELU, nn.Sigmoid, nn.Tanh):
        check_module(small_net(act), torch.randn(2, 3, 12, 12), freezing=True)


def change_in_place(model):
    model[0][0].weight.mul_(-1.5)  # bumps its version counter
    model[1][1].running_var.add_(1.0)


def replace(model):
    model[5].weight = nn.Parameter(torch.randn(5, 16))
    model[2][0].load_state_dict({"weight": torch.randn(16, 8, 1, 1)})


@pytest.mark.parametrize("change", [change_in_place, replace])
def test_frozen_tensors_changed_after_compiling_are_seen(change):
    model = small_net()
    compiled = kiln.compile(model, backend=Recorder(freezing=True))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        compiled(x)
        change(model)
        assert_equal_state(compiled(x), model(x), 1e-4, 1e-4)


def test_buffers_the_graph_writes_are_not_frozen():
    # train-mode batch norm under no_grad updates its running statistics on every call
    model = small_net().train()
    check_module(model, torch.randn(4, 3, 8, 8), calls=3, freezing=True)


def test_freezing_with_gradients_enabled_trains_as_eager():
    model = small_net()
    compiled = kiln.compile(model, backend=Recorder(freezing=True))
    x = torch.randn(2, 3, 8, 8)
    compiled(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)


def test_constant_subgraphs_fold_and_linear_weights_stay_right():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 4))
            self.scale = nn.Parameter(torch.randn(6))

        def forward(self, x):
            # (w * scale[:, None]).t() depends on parameters only: folded once
            return x @ (self.w * self.scale[:, None]).t() + self.scale.sum()

    recorder = check_module(Net(), torch.randn(3, 4), freezing=True)
    assert not any("mul" in t or "sum" in t for t in aten_targets(recorder))
