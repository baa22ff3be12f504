"""Real model code captured and correct vs eager: torch.nn.TransformerEncoderLayer, and Hugging Face
GPT-2, BERT and Llama from small configs with random weights (no downloads)."""
import pytest
import torch

import kiln
from tests.utils import CompileCounter


def encoder_layer(train):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True)
    return layer.train(train)


def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


def bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=100)
    return transformers.BertModel(config).eval()


def llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


HF_MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama}
GPT2_BERT = {"gpt2": gpt2, "bert": bert}  # the longer tests, where Llama adds time and no new construct


def token_ids():
    return torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))


def run_hf(model, backend):
    ids = token_ids()
    mask = torch.ones_like(ids)
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        expected, actual = model(input_ids=ids, attention_mask=mask), compiled(input_ids=ids, attention_mask=mask)
    for key in expected.keys():
        if isinstance(expected[key], torch.Tensor):
            torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-5)
    return actual


def test_transformer_encoder_layer_eval():
    layer = encoder_layer(train=False)
    counter = CompileCounter()
    compiled = kiln.compile(layer, backend=counter)
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count >= 1


def test_transformer_encoder_layer_eval_with_padding_mask():
    layer = encoder_layer(train=False)
    compiled = kiln.compile(layer, backend=CompileCounter())
    x = torch.randn(2, 10, 32)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 7:] = True
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, src_key_padding_mask=mask), layer(x, src_key_padding_mask=mask),
                                   rtol=1e-4, atol=1e-5)


def test_transformer_encoder_layer_train_gradients():
    layer = encoder_layer(train=True)
    counter = CompileCounter()
    compiled = kiln.compile(layer, backend=counter)
    x = torch.randn(2, 10, 32)
    expected = layer(x)
    expected.square().mean().backward()
    expected_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    actual = compiled(x)
    actual.square().mean().backward()
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    for p, g in zip(layer.parameters(), expected_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
    assert counter.frame_count >= 1


def test_transformer_encoder_layer_default_backend():
    layer = encoder_layer(train=False)
    compiled = kiln.compile(layer)
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("build", GPT2_BERT.values(), ids=GPT2_BERT.keys())
def test_hf_model_counting_backend(build):
    counter = CompileCounter()
    run_hf(build(), counter)
    assert counter.frame_count >= 1


@pytest.mark.parametrize("build", HF_MODELS.values(), ids=HF_MODELS.keys())
def test_hf_model_default_backend(build):
    run_hf(build(), "inductor")


def test_gpt2_second_call_reuses_cache():
    model = gpt2()
    counter = CompileCounter()
    run_hf(model, counter)
    first = counter.frame_count
    compiled = kiln.compile(model, backend=counter)
    ids = token_ids()
    with torch.no_grad():
        compiled(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert counter.frame_count == first


def test_transformer_encoder_layer_single_graph_like_torch_compile():
    layer = encoder_layer(train=False)
    counter = CompileCounter()
    with torch.no_grad():
        kiln.compile(layer, backend=counter)(torch.randn(2, 10, 32))
    assert counter.frame_count == 1


@pytest.mark.parametrize("build", HF_MODELS.values(), ids=HF_MODELS.keys())
def test_hf_model_single_graph_like_torch_compile(build):
    counter = CompileCounter()
    run_hf(build(), counter)
    assert counter.frame_count == 1


@pytest.mark.parametrize("build", GPT2_BERT.values(), ids=GPT2_BERT.keys())
def test_hf_model_varying_sequence_length(build):
    model = build()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    with torch.no_grad():
        for length in (16, 12, 20):
            ids = torch.randint(0, 100, (2, length), generator=torch.Generator().manual_seed(length))
            mask = torch.ones_like(ids)
            mask[1, length // 2:] = 0
            expected, actual = model(input_ids=ids, attention_mask=mask), compiled(input_ids=ids, attention_mask=mask)
            torch.testing.assert_close(actual[0], expected[0], rtol=1e-4, atol=1e-5)
    assert counter.frame_count >= 1
