"""Small hand-written networks of common shapes: a residual conv block training with BatchNorm, an
LSTM tagger, a causal self-attention block. Results, gradients and buffers equal eager's."""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

import kiln
from tests.utils import CompileCounter


class BasicBlock(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Linear(8, 5)

    def forward(self, ids):
        out, (h, c) = self.lstm(self.embed(ids))
        return self.head(out).log_softmax(-1), h


class CausalSelfAttention(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y) + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)


def train_step_matches(model, *inputs, loss=lambda out: out.square().mean()):
    torch.manual_seed(0)
    eager = copy.deepcopy(model)
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    loss(eager(*inputs)).backward()
    loss(compiled(*inputs)).backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    for b, e in zip(model.buffers(), eager.buffers()):
        torch.testing.assert_close(b, e)
    return counter


def test_residual_block_training():
    counter = train_step_matches(BasicBlock(), torch.randn(2, 4, 6, 6))
    assert counter.frame_count == 1


def test_lstm_tagger():
    ids = torch.randint(0, 20, (3, 7), generator=torch.Generator().manual_seed(0))
    train_step_matches(Tagger(), ids, loss=lambda out: out[0].mean() + out[1].sum())


def test_causal_self_attention():
    counter = train_step_matches(CausalSelfAttention(), torch.randn(2, 5, 16))
    assert counter.frame_count == 1


def test_causal_self_attention_default_backend():
    model = CausalSelfAttention().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x), rtol=1e-4, atol=1e-5)
