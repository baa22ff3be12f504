"""Vision models for the bench, written here from their papers' descriptions (torchvision's C++ ops do
not load beside the CPU torch, and these need none of them): the layer shapes of torchvision's and
timm's classification models, random weights, eval or train mode as the workload says.

Each builder takes `classes` and returns an nn.Module for 3-channel images; the workloads in
bench/vision.py pick the batch and resolution.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


def _divisible(v, divisor=8):
    """Round a channel count to a multiple of `divisor`, never more than 10% below `v` (MobileNets)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class ConvNormAct(nn.Sequential):
    """conv (no bias) -> batch norm -> activation (None: none)."""

    def __init__(self, cin, cout, kernel=3, stride=1, groups=1, act=nn.ReLU, dilation=1):
        layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2 * dilation, dilation=dilation,
                            groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.SiLU) else act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """Channel attention: global pool, two 1x1 convs, a gate."""

    def __init__(self, channels, squeezed, act=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.act = act()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class Classifier(nn.Module):
    """Global average pool, flatten, (dropout), linear."""

    def __init__(self, channels, classes, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(self.dropout(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))


# ---------------------------------------------------------------- ResNet (He et al. 2015)

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = ConvNormAct(cin, width, 3, stride)
        self.conv2 = ConvNormAct(width, width, 3, act=None)
        self.shortcut = (ConvNormAct(cin, width, 1, stride, act=None)
                         if stride != 1 or cin != width else nn.Identity())

    def forward(self, x):
        return F.relu(self.conv2(self.conv1(x)) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = ConvNormAct(cin, width, 1)
        self.conv2 = ConvNormAct(width, width, 3, stride)
        self.conv3 = ConvNormAct(width, cout, 1, act=None)
        self.shortcut = (ConvNormAct(cin, cout, 1, stride, act=None)
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.conv3(self.conv2(self.conv1(x))) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, block, depths, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(ConvNormAct(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for i, depth in enumerate(depths):
            width = 64 * 2 ** i
            for j in range(depth):
                stages.append(block(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = Classifier(cin, classes)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))


def resnet18(classes=1000):
    return ResNet(BasicBlock, (2, 2, 2, 2), classes)


def resnet50(classes=1000):
    return ResNet(Bottleneck, (3, 4, 6, 3), classes)


# ---------------------------------------------------------------- MobileNetV2 (Sandler et al. 2018)

class InvertedResidual(nn.Module):
    """1x1 expand -> depthwise kxk -> (squeeze-excite) -> 1x1 project, residual when shapes allow."""

    def __init__(self, cin, cout, stride, expand, kernel=3, act=nn.ReLU6, se=None):
        super().__init__()
        hidden = _divisible(cin * expand) if expand != 1 else cin
        layers = [ConvNormAct(cin, hidden, 1, act=act)] if expand != 1 else []
        layers.append(ConvNormAct(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se is not None:
            layers.append(se(hidden))
        layers.append(ConvNormAct(hidden, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


def mobilenet_v2(classes=1000):
    # (expansion, channels, repeats, first stride)
    config = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
              (6, 320, 1, 1)]
    layers, cin = [ConvNormAct(3, 32, 3, 2, act=nn.ReLU6)], 32
    for t, c, n, s in config:
        for i in range(n):
            layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    layers.append(ConvNormAct(cin, 1280, 1, act=nn.ReLU6))
    return nn.Sequential(*layers, Classifier(1280, classes, 0.2))


# ---------------------------------------------------------------- MobileNetV3-Large (Howard et al. 2019)

def mobilenet_v3_large(classes=1000):
    # (kernel, expanded, out, squeeze-excite, activation, stride)
    config = [(3, 16, 16, False, nn.ReLU, 1), (3, 64, 24, False, nn.ReLU, 2), (3, 72, 24, False, nn.ReLU, 1),
              (5, 72, 40, True, nn.ReLU, 2), (5, 120, 40, True, nn.ReLU, 1), (5, 120, 40, True, nn.ReLU, 1),
              (3, 240, 80, False, nn.Hardswish, 2), (3, 200, 80, False, nn.Hardswish, 1),
              (3, 184, 80, False, nn.Hardswish, 1), (3, 184, 80, False, nn.Hardswish, 1),
              (3, 480, 112, True, nn.Hardswish, 1), (3, 672, 112, True, nn.Hardswish, 1),
              (5, 672, 160, True, nn.Hardswish, 2), (5, 960, 160, True, nn.Hardswish, 1),
              (5, 960, 160, True, nn.Hardswish, 1)]
    layers, cin = [ConvNormAct(3, 16, 3, 2, act=nn.Hardswish)], 16
    for k, expanded, c, se, act, s in config:
        excite = (lambda ch: SqueezeExcite(ch, _divisible(ch // 4), nn.ReLU, nn.Hardsigmoid)) if se else None
        layers.append(InvertedResidual(cin, c, s, expanded / cin, k, act, excite))
        cin = c
    layers.append(ConvNormAct(cin, 960, 1, act=nn.Hardswish))
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(960, 1280), nn.Hardswish(),
                         nn.Dropout(0.2), nn.Linear(1280, classes))
    return nn.Sequential(*layers, head)


# ---------------------------------------------------------------- EfficientNet-B0 (Tan & Le 2019)

def efficientnet_b0(classes=1000):
    # (expansion, kernel, stride, out, repeats)
    config = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
              (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]
    layers, cin = [ConvNormAct(3, 32, 3, 2, act=nn.SiLU)], 32
    for t, k, s, c, n in config:
        for i in range(n):
            squeeze = max(1, cin // 4)
            layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t, k, nn.SiLU,
                                           lambda ch, sq=squeeze: SqueezeExcite(ch, sq, nn.SiLU)))
            cin = c
    layers.append(ConvNormAct(cin, 1280, 1, act=nn.SiLU))
    return nn.Sequential(*layers, Classifier(1280, classes, 0.2))


# ---------------------------------------------------------------- ConvNeXt-T (Liu et al. 2022)

class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


def convnext_tiny(classes=1000, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768)):
    layers = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
    for i, (depth, dim) in enumerate(zip(depths, dims)):
        if i > 0:
            layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
        layers += [ConvNeXtBlock(dim) for _ in range(depth)]
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.LayerNorm(dims[-1], eps=1e-6),
                         nn.Linear(dims[-1], classes))
    return nn.Sequential(*layers, head)


# ---------------------------------------------------------------- ViT-S/16 (Dosovitskiy et al. 2020)

class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, mlp_ratio=4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = SelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, classes=1000, image=224, patch=16, dim=384, depth=12, heads=6):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[TransformerBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def vit_small(classes=1000, image=224):
    return VisionTransformer(classes, image)


# ---------------------------------------------------------------- DenseNet-121 (Huang et al. 2016)

class DenseLayer(nn.Module):
    def __init__(self, cin, growth, bottleneck=4):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bottleneck * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bottleneck * growth)
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, padding=1, bias=False)

    def forward(self, features):
        x = self.conv1(F.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(F.relu(self.norm2(x)))


class DenseBlock(nn.Module):
    def __init__(self, layers, cin, growth):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth) for i in range(layers))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


def densenet121(classes=1000, growth=32, blocks=(6, 12, 24, 16)):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    channels = 64
    for i, n in enumerate(blocks):
        layers.append(DenseBlock(n, channels, growth))
        channels += n * growth
        if i != len(blocks) - 1:
            layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, channels // 2, 1, bias=False),
                       nn.AvgPool2d(2, 2)]
            channels //= 2
    layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers, Classifier(channels, classes))


# ---------------------------------------------------------------- RegNetY-400MF (Radosavovic et al. 2020)

class RegNetBlock(nn.Module):
    """1x1 -> grouped 3x3 -> squeeze-excite -> 1x1, residual."""

    def __init__(self, cin, cout, stride, group_width, se_ratio=0.25):
        super().__init__()
        self.a = ConvNormAct(cin, cout, 1)
        self.b = ConvNormAct(cout, cout, 3, stride, groups=cout // group_width)
        self.se = SqueezeExcite(cout, max(1, int(round(cin * se_ratio))))
        self.c = ConvNormAct(cout, cout, 1, act=None)
        self.shortcut = ConvNormAct(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.c(self.se(self.b(self.a(x)))) + self.shortcut(x))


def regnet_y_400mf(classes=1000, depths=(1, 3, 6, 6), widths=(48, 104, 208, 440), group_width=8):
    layers, cin = [ConvNormAct(3, 32, 3, 2)], 32
    for depth, width in zip(depths, widths):
        for i in range(depth):
            layers.append(RegNetBlock(cin, width, 2 if i == 0 else 1, group_width))
            cin = width
    return nn.Sequential(*layers, Classifier(cin, classes))


# ---------------------------------------------------------------- ShuffleNetV2 x1.0 (Ma et al. 2018)

def channel_shuffle(x, groups=2):
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride > 1:
            self.left = nn.Sequential(ConvNormAct(cin, cin, 3, stride, groups=cin, act=None),
                                      ConvNormAct(cin, half, 1))
        right_in = cin if stride > 1 else half
        self.right = nn.Sequential(ConvNormAct(right_in, half, 1), ConvNormAct(half, half, 3, stride, groups=half, act=None),
                                   ConvNormAct(half, half, 1))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.right(b)), 1)
        else:
            out = torch.cat((self.left(x), self.right(x)), 1)
        return channel_shuffle(out)


def shufflenet_v2(classes=1000, repeats=(4, 8, 4), channels=(24, 116, 232, 464, 1024)):
    layers = [ConvNormAct(3, channels[0], 3, 2), nn.MaxPool2d(3, 2, 1)]
    cin = channels[0]
    for n, cout in zip(repeats, channels[1:4]):
        layers += [ShuffleUnit(cin if i == 0 else cout, cout, 2 if i == 0 else 1) for i in range(n)]
        cin = cout
    layers.append(ConvNormAct(cin, channels[4], 1))
    return nn.Sequential(*layers, Classifier(channels[4], classes))


# ---------------------------------------------------------------- SqueezeNet 1.1 (Iandola et al. 2016)

class Fire(nn.Module):
    def __init__(self, cin, squeeze, expand):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1, self.expand3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x):
        s = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1(s)), F.relu(self.expand3(s))], 1)


def squeezenet1_1(classes=1000):
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(64, 16, 64), Fire(128, 16, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(128, 32, 128), Fire(256, 32, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        nn.Dropout(0.5), nn.Conv2d(512, classes, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(1))


# ---------------------------------------------------------------- MLP-Mixer (Tolstikhin et al. 2021)

class MixerBlock(nn.Module):
    def __init__(self, tokens, dim, token_hidden, channel_hidden):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


def mixer_s16(classes=1000, image=224, patch=16, dim=512, depth=8):
    tokens = (image // patch) ** 2
    return nn.Sequential(
        nn.Conv2d(3, dim, patch, patch), nn.Flatten(2), _Transpose(),
        *[MixerBlock(tokens, dim, 256, 2048) for _ in range(depth)],
        nn.LayerNorm(dim, eps=1e-6), _MeanTokens(), nn.Linear(dim, classes))


class _Transpose(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


class _MeanTokens(nn.Module):
    def forward(self, x):
        return x.mean(1)


MODELS = {
    "resnet18": resnet18, "resnet50": resnet50, "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3_large": mobilenet_v3_large, "efficientnet_b0": efficientnet_b0, "convnext_tiny": convnext_tiny,
    "vit_small": vit_small, "densenet121": densenet121, "regnet_y_400mf": regnet_y_400mf,
    "shufflenet_v2": shufflenet_v2, "squeezenet1_1": squeezenet1_1, "mixer_s16": mixer_s16,
}


def init_weights(model):
    """Random weights with sensible scales, and batch-norm statistics that are not the identity (so that
    folding them into convolutions changes the numbers)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.uniform_(m.bias, -0.1, 0.1)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.0)
            nn.init.uniform_(m.bias, -0.1, 0.1)
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model
