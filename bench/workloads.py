"""The workloads: each is a model (function or nn.Module) plus the call that runs it once.

Every builder is seeded and returns a fresh `Case`, so a workload is the same in the worker process and in
the cold/warm compile subprocesses. Sizes are chosen so that one eager call takes 1-50 ms on a small CPU.
To add a workload: write its builder (`@_seeded`, returning a Case) and list it in WORKLOADS.
"""
import functools
import importlib.util
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Case:
    """One built workload: `model` is what each compiler compiles; `run(compiled)` performs one timed call
    and returns what is compared against eager (tensors, possibly nested in tuples/lists/dicts)."""
    model: Callable
    run: Callable[[Callable], Any]


@dataclass(frozen=True)
class Workload:
    """A named benchmark. `kind` says how it is read:
    "inference" (under no_grad), "training" (a step with backward; saved-tensor memory is measured),
    "overhead" (tiny call: per-call cost in microseconds), "dynamic" (one call = a pass over many shapes;
    the first call includes every compile)."""
    name: str
    description: str
    build: Callable[[], Case]
    kind: Literal["inference", "training", "overhead", "dynamic"] = "inference"
    backend: str | Callable = "inductor"  # the same backend (name or callable) goes to kiln and torch.compile
    dynamic: bool | None = None
    static_twin: str | None = None     # for dynamic=True rows: the same call compiled static, to compare
    min_calls: int = 0                 # at least this many timed calls per compiler
    cold_warm: bool = True             # measure cold/warm compile in fresh subprocesses
    atol: float = 1e-3                 # max abs difference vs eager that still passes
    needs: tuple[str, ...] = ()        # optional modules; missing -> a skipped row

    @property
    def training(self):
        return self.kind == "training"

    def missing_modules(self):
        return [m for m in self.needs if importlib.util.find_spec(m) is None]


def _seeded(builder):
    """Seed torch before building, so weights and inputs are the same in every process."""
    @functools.wraps(builder)
    def build():
        torch.manual_seed(0)
        return builder()
    return build


def _call_with(*inputs):
    """The run of an inference case: call the compiled model on fixed inputs."""
    return lambda model: model(*inputs)


# ---------------------------------------------------------------- compiler workloads (issue 3)

def pointwise_chain(x):
    """Ten pointwise ops in a row: eager writes ten 16 MB temporaries, a fusing compiler one."""
    y = x * 1.5
    y = y + 0.5
    y = torch.sigmoid(y)
    y = y * y
    y = y - 0.25
    y = torch.relu(y)
    y = y + 1.0
    y = torch.sqrt(y)
    y = y * 2.0
    return torch.tanh(y)


@_seeded
def build_pointwise():
    return Case(pointwise_chain, _call_with(torch.randn(2048, 2048)))


def softmax(x):
    return torch.softmax(x, dim=-1)


@_seeded
def build_softmax():
    return Case(softmax, _call_with(torch.randn(4096, 1024)))


class LayerNormGeluResidual(nn.Module):
    def __init__(self, dim=1024):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return x + F.gelu(self.norm(x))


@_seeded
def build_layernorm_gelu():
    return Case(LayerNormGeluResidual().eval(), _call_with(torch.randn(4096, 1024)))


def mlp(width=512, hidden=2048, out=512):
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, out))


@_seeded
def build_mlp():
    return Case(mlp().eval(), _call_with(torch.randn(64, 512)))


def attention(q, k, v):
    """Hand-written scaled dot-product attention with a causal mask."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    seq = q.shape[-2]
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@_seeded
def build_attention():
    q, k, v = (torch.randn(8, 8, 256, 64) for _ in range(3))
    return Case(attention, _call_with(q, k, v))


class GPT2Block(nn.Module):
    """A GPT-2-style pre-norm decoder block written out by hand (causal attention + GELU MLP)."""

    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        x = x + self.proj(attention(q, k, v).transpose(1, 2).reshape(batch, seq, dim))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


@_seeded
def build_gpt2_block():
    return Case(GPT2Block().eval(), _call_with(torch.randn(8, 128, 256)))


# ---------------------------------------------------------------- models

class ConvNet(nn.Module):
    """conv-bn-relu x3, global average pool, linear."""

    def __init__(self, classes=10):
        super().__init__()
        layers, channels = [], [3, 16, 32, 64]
        for i, (cin, cout) in enumerate(zip(channels, channels[1:])):
            layers += [nn.Conv2d(cin, cout, 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                       nn.BatchNorm2d(cout), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels[-1], classes)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


@_seeded
def build_convnet():
    return Case(ConvNet().eval(), _call_with(torch.randn(8, 3, 64, 64)))


_HF_SIZES = dict(layers=2, hidden=256, heads=4, vocab=2000)


@_seeded
def build_hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    s = _HF_SIZES
    config = GPT2Config(n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"], vocab_size=s["vocab"],
                        n_positions=512, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()  # random weights: nothing is downloaded
    ids = torch.randint(0, s["vocab"], (4, 128))
    return Case(model, lambda m: m(input_ids=ids, use_cache=False, return_dict=False))


@_seeded
def build_hf_bert():
    from transformers import BertConfig, BertModel
    s = _HF_SIZES
    config = BertConfig(num_hidden_layers=s["layers"], hidden_size=s["hidden"], num_attention_heads=s["heads"],
                        intermediate_size=4 * s["hidden"], vocab_size=s["vocab"])
    model = BertModel(config).eval()
    ids = torch.randint(0, s["vocab"], (4, 128))
    mask = torch.ones_like(ids)
    return Case(model, lambda m: m(input_ids=ids, attention_mask=mask, return_dict=False))


def _zoo(name, length=128, batch=4):
    """An architecture of bench/zoo.py at 4x the test size (hidden 256), random weights: `length` tokens
    per sequence (for a vision model: images of that side, or that many images for ViT)."""
    @_seeded
    def build():
        from bench.zoo import BY_NAME, output_tensors
        arch = BY_NAME[name]
        model = arch.build(scale=4)
        inputs = arch.inputs(length, batch=batch)
        if arch.kind == "decoder":
            inputs["use_cache"] = False  # the compute, not the cache objects
        return Case(model, lambda m: output_tensors(m(**inputs)))
    build.__name__ = f"build_zoo_{name}"
    return build


ZOO_WORKLOADS = [("llama", 128), ("bloom", 128), ("t5", 128), ("deberta_v2", 128), ("vit", 16)]


# ---------------------------------------------------------------- training (issue 5)

def _training_step(inputs, target):
    """One step: forward, MSE loss, backward. Returns the loss and every parameter's gradient, so the
    comparison with eager covers the backward too."""
    def run(model):
        params = list(model.parameters())  # a compiled module (kiln's or torch's) shares the original's
        for p in params:
            p.grad = None
        loss = F.mse_loss(model(inputs), target)
        loss.backward()
        return [loss.detach()] + [p.grad for p in params]
    return run


@_seeded
def build_mlp_train():
    model = mlp().train()
    x = torch.randn(256, 512)
    return Case(model, _training_step(x, torch.randn(256, 512)))


@_seeded
def build_gpt2_block_train():
    model = GPT2Block().train()
    x = torch.randn(4, 128, 256)
    return Case(model, _training_step(x, torch.randn(4, 128, 256)))


# ---------------------------------------------------------------- capture: overhead, guards, breaks (issue 2)

def add_one(x):
    return x + 1


@_seeded
def build_add_one():
    return Case(add_one, _call_with(torch.randn(10)))


def replay_backend(gm, example_inputs):
    """A backend that runs its graph once and then returns that same result on every call: the math is gone,
    so what a call still costs is the compiler's own per-call work (guard checks, argument handling, glue).
    Valid only for a workload called again and again on the same inputs."""
    first = None

    def replay(*args):
        nonlocal first
        if first is None:
            first = gm(*args)
        return first
    return replay


@_seeded
def build_guard_mlp():
    """Twelve tiny Linear+ReLU layers: 24 modules and 24 parameters to guard."""
    layers = []
    for _ in range(12):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    return Case(nn.Sequential(*layers).eval(), _call_with(torch.randn(2, 8)))


def graph_break(x):
    """A pointwise chain, a branch on tensor data (a graph break in kiln and in torch.compile), and another
    chain: two graphs and the Python glue between them."""
    y = torch.tanh(x * 1.5 + 0.5) * 2.0
    if y.sum() > 0:
        y = y + 1.0
    return torch.sigmoid(y * y - 0.5) * 3.0


@_seeded
def build_graph_break():
    return Case(graph_break, _call_with(torch.randn(2048, 2048)))


# ---------------------------------------------------------------- dynamic shapes (issue 6)

SEQUENCE_LENGTHS = tuple(range(40, 240, 10))  # 20 lengths


@_seeded
def build_dynamic_gpt2_block():
    """One call is a pass over 20 sequence lengths; with dynamic=None both compilers compile a static graph
    first and a dynamic one when the length changes, so the first call holds every compile."""
    inputs = [torch.randn(4, seq, 256) for seq in SEQUENCE_LENGTHS]
    return Case(GPT2Block().eval(), lambda model: [model(x) for x in inputs])


WORKLOADS = [
    Workload("pointwise", "10-op pointwise chain, 2048x2048", build_pointwise),
    Workload("softmax", "softmax over the last dim, 4096x1024", build_softmax),
    Workload("layernorm_gelu", "LayerNorm + GELU + residual, 4096x1024", build_layernorm_gelu),
    Workload("mlp", "2-layer MLP 512-2048-512, batch 64", build_mlp),
    Workload("attention", "hand-written causal attention, 8x8x256x64", build_attention),
    Workload("gpt2_block", "GPT-2-style decoder block, dim 256, 4 heads, 8x128 tokens", build_gpt2_block),
    Workload("convnet", "conv-bn-relu x3, pool, linear; 8x3x64x64, eval", build_convnet),
    Workload("hf_gpt2", "HF GPT2LMHeadModel, 2 layers, dim 256, random weights, 4x128 ids", build_hf_gpt2,
             needs=("transformers",)),
    Workload("hf_bert", "HF BertModel, 2 layers, dim 256, random weights, 4x128 ids", build_hf_bert,
             needs=("transformers",)),
    *[Workload(f"zoo_{name}", f"HF {name} from bench/zoo.py, hidden 256, 2 layers, random weights, "
               + (f"{length} images 32x32" if name == "vit" else f"4x{length} tokens"), _zoo(name, length),
               needs=("transformers",)) for name, length in ZOO_WORKLOADS],
    Workload("mlp_train", "MLP training step (fwd, MSE, bwd), batch 256", build_mlp_train, kind="training"),
    Workload("gpt2_block_train", "GPT-2-style block training step, 4x128 tokens", build_gpt2_block_train,
             kind="training"),
    Workload("overhead_add_one", "x + 1 on 10 elements, backend 'eager' (per-call overhead)", build_add_one,
             kind="overhead", backend="eager", min_calls=10_000, cold_warm=False),
    Workload("guards_mlp12", "12-layer 8-wide MLP module, backend 'eager'", build_guard_mlp,
             kind="overhead", backend="eager", min_calls=10_000, cold_warm=False),
    Workload("guards_mlp12_replay", "12-layer MLP module, a backend that replays its first result: "
             "guard checks and call glue only", build_guard_mlp, kind="overhead", backend=replay_backend,
             min_calls=10_000, cold_warm=False),
    Workload("graph_break", "pointwise, branch on tensor data, pointwise; 2048x2048", build_graph_break),
    Workload("dynamic_gpt2_block", f"GPT-2-style block over {len(SEQUENCE_LENGTHS)} sequence lengths "
             "(one call = one pass), dynamic=None", build_dynamic_gpt2_block, kind="dynamic"),
    Workload("gpt2_block_dynamic", "gpt2_block compiled with dynamic=True (kernels take sizes as arguments)",
             build_gpt2_block, dynamic=True, static_twin="gpt2_block", cold_warm=False),
]

BY_NAME = {w.name: w for w in WORKLOADS}
