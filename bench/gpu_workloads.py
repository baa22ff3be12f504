"""Programs for the GPU check and bench (bench/gpu.sh): each builds its inputs on a device, in a dtype.

`PROGRAMS`: name -> (builder(device, dtype) -> (fn or module, args), what it exercises). The same
programs are checked against eager (bench/gpu_check.py) and timed (bench/gpu_bench.py).
`TRAINING`: the programs that run forward and backward (timed with grad on).

`SMALL = True` (the scripts' `--small`) builds every program at toy sizes: the dry run on a machine
without a GPU (`bench/gpu.sh dry`: CPU tensors through Triton's interpreter) checks the scripts run.
"""
import torch
from torch import nn
from torch.nn import functional as F

from bench.workloads import GPT2Block, attention as causal_attention


SMALL = False


def size(full, small):
    return small if SMALL else full


def _randn(device, dtype, *shape):
    return torch.randn(*shape, device=device).to(dtype)


def pointwise(device, dtype):
    def fn(x, y):
        return torch.tanh(x * 1.5 + y).sigmoid() * (x - y).abs().sqrt() + torch.where(x > 0, x, y.exp())
    return fn, (_randn(device, dtype, size(4096, 16), 4096), _randn(device, dtype, size(4096, 16), 4096))


def softmax(device, dtype):
    return (lambda x: torch.softmax(x * 0.5, -1)), (_randn(device, dtype, size(8192, 8), 1024),)


def long_softmax(device, dtype):
    return (lambda x: torch.softmax(x, -1)), (_randn(device, dtype, size(256, 2), 32768),)


def layernorm(device, dtype):
    norm = nn.LayerNorm(1024).to(device, dtype)
    return (lambda x: x + F.gelu(norm(x))), (_randn(device, dtype, size(8192, 8), 1024),)


def attention(device, dtype):
    q, k, v = (_randn(device, dtype, size(8, 1), size(12, 2), size(512, 16), 64) for _ in range(3))
    return causal_attention, (q, k, v)


def gpt2_block(device, dtype):
    return GPT2Block(size(768, 64), size(12, 2)).to(device, dtype).eval(), (_randn(device, dtype, size(8, 1), size(512, 16), size(768, 64)),)


def reductions(device, dtype):
    def fn(x):
        return x.sum(0), x.amax(-1), x.float().var(-1), (x > 0).any(-1), x.mean()
    return fn, (_randn(device, dtype, size(3000, 30), 777),)


def indexing(device, dtype):
    rows = size(50000, 500)
    table = _randn(device, dtype, rows, size(256, 16))
    ids = torch.randint(0, rows, (size(64, 4), size(128, 8)), device=device)
    return (lambda t, i: F.embedding(i, t) * 2 + t[i[:, :1]].sum(-1, keepdim=True)), (table, ids)


def small_mlp(device, dtype):
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64)).to(device, dtype)
    return model.eval(), (_randn(device, dtype, 8, 64),)


def hf_gpt2(device, dtype):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=size(4, 1), n_embd=size(768, 64), n_head=size(12, 2), vocab_size=size(50257, 500),
                        n_positions=1024)
    model = GPT2LMHeadModel(config).to(device, dtype).eval()
    ids = torch.randint(0, config.vocab_size, (size(4, 1), size(512, 16)), device=device)
    return (lambda ids: model(input_ids=ids, use_cache=False, return_dict=False)[0]), (ids,)


def hf_bert(device, dtype):
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=size(4, 1), hidden_size=size(768, 64), num_attention_heads=size(12, 2),
                        intermediate_size=size(3072, 128), vocab_size=size(30522, 500))
    model = BertModel(config).to(device, dtype).eval()
    ids = torch.randint(0, config.vocab_size, (size(8, 1), size(256, 16)), device=device)
    return (lambda ids: model(input_ids=ids, return_dict=False)[0]), (ids,)


def train_step(device, dtype):
    """A GPT-2 block's training step: forward, loss, backward (the gradients accumulate in .grad)."""
    model = GPT2Block(size(768, 64), size(12, 2)).to(device, dtype)
    x = _randn(device, dtype, size(8, 1), size(256, 16), size(768, 64))

    def step(x):
        loss = model(x).float().square().mean()
        loss.backward()
        return loss.detach()
    return step, (x,)


TRAINING = {"train_step"}

PROGRAMS = {
    "pointwise": (pointwise, "a pointwise chain, 16M elements"),
    "softmax": (softmax, "rows of 1024: persistent reduction"),
    "long_softmax": (long_softmax, "rows of 32768: looped reduction"),
    "layernorm": (layernorm, "LayerNorm + GELU + residual"),
    "reductions": (reductions, "sum over dim 0, amax, var, any, mean"),
    "indexing": (indexing, "embedding and a gather (checked indices)"),
    "attention": (attention, "causal attention, matmuls as aten"),
    "gpt2_block": (gpt2_block, "a GPT-2 block, dim 768"),
    "small_mlp": (small_mlp, "a small-batch MLP: per-call overhead"),
    "hf_gpt2": (hf_gpt2, "Hugging Face GPT-2, 4 layers, seq 512"),
    "hf_bert": (hf_bert, "Hugging Face BERT, 4 layers, seq 256"),
    "train_step": (train_step, "a GPT-2 block's forward and backward, dim 768"),
}
