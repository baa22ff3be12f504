"""Channels-last convolutions in inference graphs (layout_opt): results, output layouts and module
state equal to eager's, whatever the graph does around its convolutions."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.compiler.vision_helpers import check_module, conv_bn, randomize_norms


def wide(cin=8, cout=8):
    """Large activations next to the weight: runs channels-last without freezing too."""
    return randomize_norms(nn.Sequential(conv_bn(3, cin), conv_bn(cin, cout, groups=cin), conv_bn(cout, cout, 1)))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.body = conv_bn(3, 8), conv_bn(8, 8, act=None)

    def forward(self, x):
        y = self.stem(x)
        return F.relu(self.body(y) + y)


class Branches(nn.Module):
    """Concatenation, pooling, a flatten straight after a convolution, and a convolution output returned."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = conv_bn(3, 4), conv_bn(3, 4, 1), nn.Conv2d(8, 6, 3, 2, 1)

    def forward(self, x):
        y = torch.cat([self.a(x), self.b(x)], 1)
        z = self.c(F.max_pool2d(y, 3, 2, 1))
        return z, z.flatten(1) * 2, y.mean((2, 3))


@pytest.mark.parametrize("freezing", [False, True])
@pytest.mark.parametrize("make", [wide, Residual, Branches])
def test_convolution_nets_match_eager(make, freezing):
    torch.manual_seed(0)
    model = randomize_norms(make()).eval()
    check_module(model, torch.randn(2, 3, 20, 20), freezing=freezing)


@pytest.mark.parametrize("freezing", [False, True])
def test_channels_last_input_matches_eager(freezing):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    check_module(Residual().eval(), x, freezing=freezing)


def test_layout_optimization_off_runs_nchw():
    torch.manual_seed(0)
    on = check_module(wide().eval(), torch.randn(2, 3, 20, 20))
    off = check_module(wide().eval(), torch.randn(2, 3, 20, 20), layout_optimization=False)
    assert "memory_format=torch.channels_last" in on.compiled[0].kiln_wrapper or \
        _has_channels_last_buffer(on.compiled[0].kiln_wrapper)
    assert not _has_channels_last_buffer(off.compiled[0].kiln_wrapper)


def _has_channels_last_buffer(wrapper_source):
    # an NCHW buffer of 8 channels at 20x20 has strides (3200, 400, 20, 1); channels-last (3200, 1, 160, 8)
    return "(3200, 1, 160, 8)" in wrapper_source


def test_convolution_of_a_graph_input_written_in_place_matches_eager():
    conv = nn.Conv2d(3, 4, 3, padding=1).eval()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            y = self.conv(x)
            x.mul_(2)  # the input is written after the convolution read it
            return y.relu()

    check_module(Net(), torch.randn(1, 3, 24, 24))
