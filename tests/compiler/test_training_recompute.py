"""What the partitioner recomputes in the backward and what it saves (kiln.compiler.partition):
values a matmul in the backward reads are saved, not recomputed; cheap values the backward fuses
are recomputed; the backward reads every value saved for it; gradients stay eager's."""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from kiln.compiler.partition import _descendants as descendants, _returns_view, _view_base as view_base
from kiln.compiler.training import TrainingGraph

aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default}


def training_graph(fn, args, inner="eager", recompute=True):
    return TrainingGraph(fx.symbolic_trace(fn), args, {}, inner, recompute)


def leaves(shapes, seed=0):
    torch.manual_seed(seed)
    return [torch.randn(*s, requires_grad=True) for s in shapes]


def gelu_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


GELU_MLP_SHAPES = [(32, 16), (64, 16), (64,), (16, 64), (16,)]


def attention(x, wq, wk, wv):
    q, k, v = ((x @ w).view(2, 8, 2, 4).transpose(1, 2) for w in (wq, wk, wv))
    scores = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    return torch.tanh(scores @ v).sum(1)


ATTENTION_SHAPES = [(2, 8, 8), (8, 8), (8, 8), (8, 8)]


def ops(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def assert_grads_match_eager(fn, shapes, inner):
    expected_args, args = leaves(shapes), leaves(shapes)
    fn(*expected_args).sum().backward()
    training_graph(fn, leaves(shapes), inner)(*args).sum().backward()
    for a, e in zip(args, expected_args):
        torch.testing.assert_close(a.grad, e.grad)


@pytest.mark.parametrize("fn, shapes", [(gelu_mlp, GELU_MLP_SHAPES), (attention, ATTENTION_SHAPES)])
def test_matmuls_in_backward_read_saved_values_not_recomputed_ones(fn, shapes):
    """GELU's output feeds the second weight's gradient (a matmul): recomputing it would be a
    second erf pass and a second write of it, where the forward has written it already."""
    tg = training_graph(fn, leaves(shapes))
    backward = tg.partition.backward
    placeholders = list(backward.graph.find_nodes(op="placeholder"))
    gradient_math = descendants(placeholders[tg.partition.num_saved:])  # from the tangents
    for mm in (n for n in ops(backward) if n.target in MATMULS):
        for arg in mm.all_input_nodes:
            base = view_base(arg)
            assert base in placeholders or base in gradient_math, \
                f"{mm.format_node()} reads {base.format_node()}, recomputed in the backward"


def test_gelu_output_is_saved_and_erf_runs_once_in_backward():
    tg = training_graph(gelu_mlp, leaves(GELU_MLP_SHAPES))
    erfs = [n for n in ops(tg.partition.backward) if n.target in (aten.erf.default, aten.erfc.default)]
    assert len(erfs) == 1  # GELU's own derivative needs erf(c); the saved output needs none
    saved = tg.partition.forward.graph.output_node().args[0][1:]
    assert any(s.target is aten.mul.Tensor and s.meta["val"].shape == (32, 64) for s in saved)


def test_pointwise_value_that_backward_fuses_is_still_recomputed():
    """sin(x * w)'s derivative cos(x * w) is recomputed from the inputs: nothing saved but them."""
    def f(x, w):
        return torch.sin(x * w).sum()
    tg = training_graph(f, leaves([(64,), (64,)]))
    assert tg.partition.saved_bytes == 0
    assert aten.cos.default in [n.target for n in ops(tg.partition.backward)]


@pytest.mark.parametrize("fn, shapes", [(gelu_mlp, GELU_MLP_SHAPES), (attention, ATTENTION_SHAPES)])
def test_backward_reads_every_saved_value(fn, shapes):
    backward = training_graph(fn, leaves(shapes)).partition.backward
    unread = [p.name for p in backward.graph.find_nodes(op="placeholder") if not p.users]
    assert not unread


@pytest.mark.parametrize("fn, shapes", [(gelu_mlp, GELU_MLP_SHAPES), (attention, ATTENTION_SHAPES)])
def test_saved_values_are_not_views_of_intermediates(fn, shapes):
    """A view is as dear to keep as its base and cheap to redo: the base is what is saved."""
    tg = training_graph(fn, leaves(shapes))
    primals = set(tg.partition.forward.graph.find_nodes(op="placeholder"))
    saved = tg.partition.forward.graph.output_node().args[0][tg.num_forward:]
    assert all(not _returns_view(s) or view_base(s) in primals for s in saved)


@pytest.mark.parametrize("fn, shapes", [(gelu_mlp, GELU_MLP_SHAPES), (attention, ATTENTION_SHAPES)])
def test_min_cut_still_saves_no_more_than_saving_what_backward_reads(fn, shapes):
    min_cut = training_graph(fn, leaves(shapes)).partition
    save_used = training_graph(fn, leaves(shapes), recompute=False).partition
    assert min_cut.saved_bytes <= save_used.saved_bytes


@pytest.mark.parametrize("inner", ["eager", "cpp"])
@pytest.mark.parametrize("fn, shapes", [(gelu_mlp, GELU_MLP_SHAPES), (attention, ATTENTION_SHAPES)])
def test_gradients_match_eager(fn, shapes, inner):
    assert_grads_match_eager(fn, shapes, inner)
