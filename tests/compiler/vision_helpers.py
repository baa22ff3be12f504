"""Shared pieces of the convolution-net tests (layout, freezing, memory plan): a backend that keeps
what kiln compiled, and an eager-vs-compiled check of a module's results and state."""
import copy

import torch
from torch import nn

import kiln
from kiln.backends.registry import lookup_backend
from kiln.config import compiler_options
from tests.utils import CompileCounter, assert_equal_state


class Recorder(CompileCounter):
    """Counts graphs, compiles each with kiln's "inductor" under `options` and keeps what it returned
    (its kiln_source, kiln_wrapper, kiln_fallbacks)."""

    def __init__(self, **options):
        super().__init__()
        self.inner, self.options = lookup_backend("inductor"), compiler_options(options=options or None)
        self.compiled = []

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        self.compiled.append(self.inner(gm, example_inputs, options=self.options))
        return self.compiled[-1]


def check_module(model, *inputs, calls=2, rtol=1e-4, atol=1e-4, **options):
    """A copy of `model` compiled (under no_grad, one graph) with `options` gives eager's results, and
    leaves its parameters and buffers (and the inputs) as eager's run does, call after call. Returns
    the Recorder."""
    recorder = Recorder(**options)
    eager_model, compiled_model = model, copy.deepcopy(model)
    compiled = kiln.compile(compiled_model, backend=recorder)
    with torch.no_grad():
        for _ in range(calls):
            eager_inputs, compiled_inputs = copy.deepcopy(inputs), copy.deepcopy(inputs)
            expected, actual = eager_model(*eager_inputs), compiled(*compiled_inputs)
            assert_equal_state(actual, expected, rtol, atol)
            if isinstance(expected, torch.Tensor):
                assert actual.stride() == expected.stride(), "the output's layout differs from eager's"
            assert_equal_state(compiled_inputs, eager_inputs, rtol, atol)
            assert_equal_state(dict(compiled_model.state_dict()), dict(eager_model.state_dict()), rtol, atol)
    assert recorder.frame_count == 1, f"{recorder.frame_count} graphs"
    return recorder


def conv_bn(cin, cout, kernel=3, stride=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act is not None else nn.Sequential(*layers)


def randomize_norms(model, seed=0):
    """Batch norms with statistics and affine parameters away from their defaults (which fold to
    identities and would hide a wrong fold)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=g))
                m.bias.copy_(torch.randn(m.num_features, generator=g))
    return model
