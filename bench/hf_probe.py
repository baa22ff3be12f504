"""Any Hugging Face architecture through kiln, as a new user would try it: code no one here wrote.

    python -m bench.hf_probe cohere mpnet whisper ...        # inference: graphs, breaks, equal, fullgraph
    python -m bench.hf_probe --train mpnet whisper ...       # a training step: gradients vs float64 eager

Per model type (any `transformers` model type; AutoConfig with small sizes, random weights): eager
must run first (types whose configs need more than the common knobs are reported and skipped);
then `kiln.explain` (graphs, break reasons, frames run eagerly), the default backend against eager
at three lengths (sequence 8/13/21, images 32/48/64) and `fullgraph=True`. `--train` compares a
compiled training step's gradients (dynamic=True, two lengths) with eager's, both against float64
eager, and prints the worst relative error of each. One JSON line per model.
"""
import argparse
import ast
import contextlib
import copy
import io
import json

import torch

import kiln

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128,
             max_position_embeddings=256, n_embd=64, n_layer=2, n_head=4, d_model=64, num_layers=2, num_heads=4,
             encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, n_positions=256, num_key_value_heads=2, pad_token_id=0,
             bos_token_id=1, eos_token_id=2, decoder_start_token_id=0, image_size=32, patch_size=8)
LENGTHS = (8, 13, 21)
SIDES = {8: 32, 13: 48, 21: 64}


def build(model_type):
    """`model_type`, or `model_type:key=value,key=value` for a config that needs more than SMALL's knobs."""
    from transformers import AutoConfig, AutoModel
    torch.manual_seed(0)
    model_type, _, extra = model_type.partition(":")
    knobs = dict(SMALL, **{k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in extra.split(",") if kv)})
    config = AutoConfig.for_model(model_type, **knobs)
    return config, AutoModel.from_config(config).eval()


def inputs(config, model, length):
    name = model.main_input_name
    if name == "pixel_values":
        side = SIDES[length]
        return dict(pixel_values=torch.randn(2, getattr(config, "num_channels", 3), side, side))
    if name == "input_values":
        return dict(input_values=torch.randn(2, 400 * length))
    if name == "input_features":
        return dict(input_features=torch.randn(2, getattr(config, "num_mel_bins", 80), 3000),
                    decoder_input_ids=torch.randint(3, 128, (2, length)))
    kw = dict(input_ids=torch.randint(3, 128, (2, length)))
    if config.is_encoder_decoder:
        kw["decoder_input_ids"] = torch.randint(3, 128, (2, length - 3))
    return kw


def tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    elif isinstance(out, dict):
        out = tuple(out.values())
    return [t for x in out for t in tensors(x)] if isinstance(out, (list, tuple)) else []


def _error(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def probe(model_type):
    config, model = build(model_type)
    with torch.no_grad():
        try:
            model(**inputs(config, model, LENGTHS[0]))
        except Exception as e:
            return dict(model=model_type, eager_error=_error(e))
        with contextlib.redirect_stdout(io.StringIO()):  # (kiln.explain prints its report)
            explained = kiln.explain(model)(**inputs(config, model, LENGTHS[0]))
        row = dict(model=model_type, graphs=explained.graph_count,
                   breaks=[str(b)[:200] for b in explained.break_reasons][:4],
                   eager_frames=[str(f)[:200] for f in explained.eager_frames][:3])
        for fullgraph in (False, True):
            compiled = kiln.compile(model, fullgraph=fullgraph)
            try:
                equal = {}
                for length in LENGTHS:
                    kw = inputs(config, model, length)
                    expected, actual = tensors(model(**kw)), tensors(compiled(**kw))
                    equal[length] = len(expected) == len(actual) > 0 and all(
                        a.shape == e.shape and torch.allclose(a, e, rtol=1e-4, atol=1e-4) for a, e in zip(actual, expected))
                row["fullgraph" if fullgraph else "equal"] = "ok" if fullgraph else equal
            except Exception as e:
                row["fullgraph" if fullgraph else "equal"] = _error(e)
            if fullgraph:
                break
    return row


def gradients(call, model, kw):
    """The gradients of `model`'s parameters from one step of `call` (the model, or it compiled)."""
    loss = sum((t.double() ** 2).mean() for t in tensors(call(**kw)) if t.is_floating_point())
    loss.backward()
    grads = {n: p.grad.double().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def probe_training(model_type):
    config, model = build(model_type)
    exact, mine = copy.deepcopy(model).double(), copy.deepcopy(model)
    compiled = kiln.compile(mine, dynamic=True)
    row = dict(model=model_type)
    try:
        for length in LENGTHS[:2]:
            kw = inputs(config, model, length)
            wide = {k: v.double() if v.is_floating_point() else v for k, v in kw.items()}  # (images, audio)
            truth, eager, kilns = gradients(exact, exact, wide), gradients(model, model, kw), gradients(compiled, mine, kw)
            # a gradient that is zero in exact arithmetic (a bias under softmax) is rounding noise
            scale = max(t.abs().max().item() for t in truth.values())
            worst = max((((kilns[n] - t).abs().max() / (t.abs().max() + 1e-30)).item(),
                         ((eager[n] - t).abs().max() / (t.abs().max() + 1e-30)).item(), n)
                        for n, t in truth.items() if t.abs().max() > 1e-6 * scale)
            row[length] = dict(kiln_error=f"{worst[0]:.1e}", eager_error=f"{worst[1]:.1e}", parameter=worst[2])
    except Exception as e:
        row["error"] = _error(e)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="+")
    parser.add_argument("--train", action="store_true", help="compare a training step's gradients")
    args = parser.parse_args()
    for model_type in args.model_types:
        try:
            row = probe_training(model_type) if args.train else probe(model_type)
        except Exception as e:
            row = dict(model=model_type, error=_error(e))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
