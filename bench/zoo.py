"""A model zoo: Hugging Face architectures from small random configs (nothing is downloaded).

Each `Arch` builds a seeded model in eval mode and the keyword inputs for one call at a given "length"
(tokens per sequence; for vision models the image side). tests/models/test_zoo.py checks capture and
correctness on them; bench/workloads.py times a few at a larger size (`scale`).
"""
import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Callable

import torch

VOCAB = 128


@dataclass(frozen=True)
class Arch:
    """One architecture: `config(scale)` returns (model class name, config class name, config kwargs)."""
    name: str
    kind: str                  # "decoder", "encoder", "seq2seq", "vision"
    model_class: str
    config_class: str
    config: Callable[[int], dict]
    lengths: tuple = (8, 12, 17)
    lengths_fixed: int = 32                # the length when `vary` is "batch"
    extra_inputs: Callable = None          # (ids) -> extra kwargs, e.g. decoder_input_ids
    vary: str = "length"                   # what `lengths` vary: "length" (tokens / image side) or "batch"
    tags: tuple = field(default=())        # "slow": left out of the default test run

    def available(self):
        return importlib.util.find_spec("transformers") is not None

    def build(self, scale=1):
        import transformers
        torch.manual_seed(0)
        config = getattr(transformers, self.config_class)(**self.config(scale))
        return getattr(transformers, self.model_class)(config).eval()

    def inputs(self, length, batch=2):
        gen = torch.Generator().manual_seed(length)
        if self.vary == "batch":
            batch, length = length, self.lengths_fixed
        if self.kind == "vision":
            return {"pixel_values": torch.randn(batch, 3, length, length, generator=gen)}
        ids = torch.randint(1, VOCAB, (batch, length), generator=gen)
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if self.extra_inputs is not None:
            kwargs.update(self.extra_inputs(ids))
        return kwargs


def first_tensor(out):
    """The model's main output (logits or last hidden state) from a ModelOutput, tuple or tensor."""
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if hasattr(out, "values") and not isinstance(out, tuple) else out
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"no tensor in {type(out).__name__}")


def output_tensors(out):
    """Every tensor in a model output (nested tuples of ModelOutputs and caches left out)."""
    if isinstance(out, torch.Tensor):
        return [out]
    values = out.values() if hasattr(out, "values") and not isinstance(out, tuple) else out
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in v):
            found.extend(v)
    return found


def _text(hidden, heads=4, layers=2, inter=2):
    return dict(hidden=hidden, heads=heads, layers=layers, inter=inter * hidden)


def _llama_like(**extra):
    def config(scale):
        h = 64 * scale
        return dict(vocab_size=VOCAB, hidden_size=h, intermediate_size=2 * h, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    pad_token_id=0, **extra)
    return config


def _gemma(**extra):
    return _llama_like(head_dim=16, **extra)


def _bert_like(**extra):
    def config(scale):
        h = 64 * scale
        return dict(vocab_size=VOCAB, hidden_size=h, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=2 * h, max_position_embeddings=256, **extra)
    return config


def _decoder_inputs(ids):
    return {"decoder_input_ids": ids[:, : max(2, ids.shape[1] // 2)].contiguous()}


def _scaled(fn):
    """Config builders that only use the hidden size: fn(h) with h = 64 * scale."""
    @functools.wraps(fn)
    def config(scale):
        return fn(64 * scale)
    return config


ARCHS = [
    # ---- decoders: the Llama family
    Arch("llama", "decoder", "LlamaForCausalLM", "LlamaConfig", _llama_like()),
    Arch("mistral", "decoder", "MistralForCausalLM", "MistralConfig", _llama_like(sliding_window=None)),
    Arch("qwen2", "decoder", "Qwen2ForCausalLM", "Qwen2Config", _llama_like()),
    Arch("qwen3", "decoder", "Qwen3ForCausalLM", "Qwen3Config", _llama_like(head_dim=16)),
    Arch("gemma", "decoder", "GemmaForCausalLM", "GemmaConfig", _gemma()),
    Arch("gemma2", "decoder", "Gemma2ForCausalLM", "Gemma2Config", _gemma(sliding_window=8)),
    Arch("mixtral", "decoder", "MixtralForCausalLM", "MixtralConfig",
         _llama_like(num_local_experts=4, num_experts_per_tok=2)),
    Arch("phi3", "decoder", "Phi3ForCausalLM", "Phi3Config", _llama_like()),
    # ---- decoders: others
    Arch("phi", "decoder", "PhiForCausalLM", "PhiConfig", _llama_like()),
    Arch("gpt2", "decoder", "GPT2LMHeadModel", "GPT2Config",
         _scaled(lambda h: dict(vocab_size=VOCAB, n_embd=h, n_layer=2, n_head=4, n_positions=256))),
    Arch("gpt_neo", "decoder", "GPTNeoForCausalLM", "GPTNeoConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, hidden_size=h, num_layers=2, num_heads=4,
                                attention_types=[[["global", "local"], 1]], window_size=8,
                                max_position_embeddings=256))),
    Arch("gptj", "decoder", "GPTJForCausalLM", "GPTJConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, n_embd=h, n_layer=2, n_head=4, rotary_dim=8, n_positions=256))),
    Arch("gpt_neox", "decoder", "GPTNeoXForCausalLM", "GPTNeoXConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, hidden_size=h, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=2 * h, max_position_embeddings=256))),
    Arch("falcon", "decoder", "FalconForCausalLM", "FalconConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, hidden_size=h, num_hidden_layers=2, num_attention_heads=4))),
    Arch("opt", "decoder", "OPTForCausalLM", "OPTConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, hidden_size=h, num_hidden_layers=2, num_attention_heads=4,
                                ffn_dim=2 * h, word_embed_proj_dim=h, max_position_embeddings=256))),
    Arch("bloom", "decoder", "BloomForCausalLM", "BloomConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, hidden_size=h, n_layer=2, n_head=4))),
    # ---- encoders
    Arch("bert", "encoder", "BertModel", "BertConfig", _bert_like()),
    Arch("roberta", "encoder", "RobertaModel", "RobertaConfig", _bert_like(pad_token_id=0)),
    Arch("distilbert", "encoder", "DistilBertModel", "DistilBertConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, dim=h, n_layers=2, n_heads=4, hidden_dim=2 * h,
                                max_position_embeddings=256))),
    Arch("albert", "encoder", "AlbertModel", "AlbertConfig", _bert_like(embedding_size=32)),
    Arch("electra", "encoder", "ElectraModel", "ElectraConfig", _bert_like(embedding_size=32)),
    Arch("deberta_v2", "encoder", "DebertaV2Model", "DebertaV2Config",
         _bert_like(relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"])),
    Arch("mobilebert", "encoder", "MobileBertModel", "MobileBertConfig",
         _bert_like(embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                    num_feedforward_networks=2)),
    # ---- encoder-decoders and XLNet
    Arch("t5", "seq2seq", "T5Model", "T5Config",
         _scaled(lambda h: dict(vocab_size=VOCAB, d_model=h, d_kv=16, d_ff=2 * h, num_layers=2, num_heads=4,
                                decoder_start_token_id=0)),
         extra_inputs=_decoder_inputs),
    Arch("bart", "seq2seq", "BartModel", "BartConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, d_model=h, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * h,
                                decoder_ffn_dim=2 * h, max_position_embeddings=256)),
         extra_inputs=_decoder_inputs),
    Arch("xlnet", "encoder", "XLNetModel", "XLNetConfig",
         _scaled(lambda h: dict(vocab_size=VOCAB, d_model=h, n_layer=2, n_head=4, d_inner=2 * h, mem_len=32))),
    # ---- vision (length = image side)
    Arch("vit", "vision", "ViTModel", "ViTConfig",
         _scaled(lambda h: dict(hidden_size=h, num_hidden_layers=2, num_attention_heads=4, intermediate_size=2 * h,
                                image_size=32, patch_size=8)),
         lengths=(2, 3, 5), vary="batch"),
    Arch("convnext", "vision", "ConvNextModel", "ConvNextConfig",
         _scaled(lambda h: dict(hidden_sizes=[h // 4, h // 2], depths=[1, 1], num_stages=2)),
         lengths=(32, 48, 64)),
    Arch("resnet", "vision", "ResNetModel", "ResNetConfig",
         _scaled(lambda h: dict(hidden_sizes=[h // 4, h // 2], depths=[1, 1], embedding_size=h // 4,
                                layer_type="basic")),
         lengths=(32, 48, 64)),
]

BY_NAME = {a.name: a for a in ARCHS}
