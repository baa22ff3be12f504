"""Training through `kiln.compile`: capture lifts parameters as graph inputs, the compiler runs
forward and backward compiled; gradients, buffers and losses equal eager's."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

BACKENDS = ["aot_eager", "inductor"]


def compiled_by_kiln(out):
    """Whether `out` was produced by kiln's training autograd node."""
    return type(out.grad_fn).__name__ == "_CompiledFunctionBackward"


def check_module_training(model, *inputs, backend, rtol=1e-5, atol=1e-5):
    """One forward+backward of `model` compiled and eager (a copy): outputs, parameter and
    input gradients, and buffers after the call must match."""
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend)
    eager_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out, expected = compiled(*inputs), reference(*eager_inputs)
    assert compiled_by_kiln(out)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=f"grad of {name}")
    for b, c in zip(model.buffers(), reference.buffers()):
        torch.testing.assert_close(b, c)
    for x, e in zip(inputs, eager_inputs):
        if x.requires_grad:
            torch.testing.assert_close(x.grad, e.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    check_module_training(model, torch.randn(6, 12, requires_grad=True), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_net_with_batchnorm(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    check_module_training(model.train(), torch.randn(4, 3, 6, 6), backend=backend, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformer_encoder_layer(backend):
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).train()
    check_module_training(model, torch.randn(2, 6, 16), backend=backend, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_function_with_a_graph_break(backend):
    def f(x, w):
        y = (x @ w).tanh()
        print("", end="")  # a graph break: two compiled graphs, gradients flow across
        return (y * w.sum(0)).sigmoid().sum()
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    xe, we = (t.detach().clone().requires_grad_() for t in (x, w))
    loss = kiln.compile(f, backend=backend)(x, w)
    assert compiled_by_kiln(loss)
    loss.backward()
    f(xe, we).backward()
    torch.testing.assert_close((x.grad, w.grad), (xe.grad, we.grad))


@pytest.mark.parametrize("backend", BACKENDS)
def test_five_sgd_steps_give_eager_losses(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 1))
    reference = copy.deepcopy(model)
    data, target = torch.randn(32, 10), torch.randn(32, 1)

    def train(m, forward):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for _ in range(5):
            loss = F.mse_loss(forward(data), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses
    compiled_losses = train(model, kiln.compile(model, backend=backend))
    eager_losses = train(reference, reference)
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    assert eager_losses[-1] < eager_losses[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_grad_and_enable_grad_regions(backend):
    def f(x, w):
        a = x * w
        with torch.no_grad():
            b = a.exp()
            with torch.enable_grad():
                c = (a * b).sin()
        return (a + b + c).sum(), b
    x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    xe, we = (t.detach().clone().requires_grad_() for t in (x, w))
    loss, b = kiln.compile(f, backend=backend)(x, w)
    expected_loss, expected_b = f(xe, we)
    assert compiled_by_kiln(loss) and not b.requires_grad
    loss.backward()
    expected_loss.backward()
    torch.testing.assert_close((loss, b, x.grad, w.grad), (expected_loss, expected_b, xe.grad, we.grad))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_with_fallback_random_equals_eager_under_one_seed(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.4), nn.Linear(32, 2)).train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend, options={"fallback_random": True})
    x = torch.randn(16, 8)
    results = []
    for m, fn in ((model, compiled), (reference, reference)):
        torch.manual_seed(7)
        out = fn(x)
        out.square().sum().backward()
        results.append((out, *(p.grad for p in m.parameters())))
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_then_evaluate_under_no_grad_then_train(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend)
    x = torch.randn(6, 8)
    for phase in ("train", "eval", "train"):
        model.train(phase == "train")
        reference.train(phase == "train")
        if phase == "eval":
            with torch.no_grad():
                out, expected = compiled(x), reference(x)
            assert not out.requires_grad
        else:
            out, expected = compiled(x), reference(x)
            out.sum().backward()
            expected.sum().backward()
        torch.testing.assert_close(out, expected)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        for b, c in zip(model.buffers(), reference.buffers()):
            torch.testing.assert_close(b, c)


def test_hugging_face_gpt2_training_step():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 8))
    loss = kiln.compile(model)(ids, labels=ids).loss
    expected = reference(ids, labels=ids).loss
    assert compiled_by_kiln(loss)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=f"grad of {name}")


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_size_changes(backend, dynamic):
    """Capture passes real example inputs and records symbolic sizes on the placeholders; the
    training graph must serve every batch size it is called with, or be recompiled."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend, dynamic=dynamic)
    for batch in (5, 7, 9):
        x = torch.randn(batch, 8)
        out, expected = compiled(x), reference(x)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


class _ClampedWithStats(nn.Module):
    """Writes to a parameter and a buffer under no_grad, returns a tuple with an integer tensor and
    a dict."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 3)
        self.register_buffer("ema", torch.zeros(16))

    def forward(self, x):
        with torch.no_grad():
            self.l1.weight.clamp_(-0.5, 0.5)
        h = F.relu(self.l1(x))
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * h.mean(0))
        return self.l2(h), h.argmax(-1), {"norm": h.norm().detach()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_to_parameters_and_buffers_under_no_grad(backend):
    torch.manual_seed(0)
    model = _ClampedWithStats()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(5, 8)
        (out, idx, stats), (expected, expected_idx, expected_stats) = compiled(x), reference(x)
        assert compiled_by_kiln(out)
        torch.testing.assert_close((out, idx, stats), (expected, expected_idx, expected_stats))
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close((p, p.grad), (q, q.grad))
        torch.testing.assert_close(model.ema, reference.ema)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_graph_whose_sizes_come_from_tensor_data_runs_eagerly(backend):
    """Sizes read out of a tensor (tolist) in a graph that needs gradients: the aot trace cannot
    follow them, so the graph runs eagerly (as the inference path does), not a compile error."""
    def chunks(x, sizes):
        parts = torch.split(x * 2, sizes.tolist())
        return [p.cumsum(0) for p in parts]
    x, sizes = torch.randn(12, requires_grad=True), torch.tensor([5, 4, 3])
    x_ref = x.detach().clone().requires_grad_(True)
    out, expected = kiln.compile(chunks, backend=backend, fullgraph=True)(x, sizes), chunks(x_ref, sizes)
    torch.testing.assert_close(out, expected)
    sum(o.square().sum() for o in out).backward()
    sum(e.square().sum() for e in expected).backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_written_into_a_view_of_a_buffer_viewed_again(backend):
    """A slice of a new buffer is written, the buffer viewed to another shape, transposed and
    updated in place: its backward copies a transposed gradient into a buffer that it then views,
    which the trace can take only if the copy keeps the buffer's layout, as eager's copy_ does."""
    def scatter_then_view(a):
        buf = torch.zeros(6, 4, 8)
        buf[:, 1, 2:6] = a
        v = buf.view(2, 3, 32).transpose(1, 2)
        v.mul_(2)
        return v
    a = torch.randn(6, 4, requires_grad=True)
    a_ref = a.detach().clone().requires_grad_(True)
    out, expected = kiln.compile(scatter_then_view, backend=backend)(a), scatter_then_view(a_ref)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(a.grad, a_ref.grad)
