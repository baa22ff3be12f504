"""The forward/backward partition (kiln.compiler.partition): what is saved, what is recomputed."""
import pytest
import torch
import torch.nn.functional as F

from kiln.compiler.training import TrainingGraph

aten = torch.ops.aten


def training_graph(fn, args, recompute=True, **options):
    return TrainingGraph(torch.fx.symbolic_trace(fn), args, options, "eager", recompute)


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def mlp(x, w1, b1, w2, b2, w3, b3):
    h = F.gelu(F.linear(x, w1, b1))
    h = torch.tanh(F.linear(h, w2, b2)) * 2 + 1
    return F.linear(h, w3, b3).relu()


def mlp_args():
    torch.manual_seed(0)
    shapes = [(64, 32), (48, 32), (48,), (48, 48), (48,), (8, 48), (8,)]
    return [torch.randn(*s, requires_grad=True) for s in shapes]


def test_min_cut_saves_fewer_bytes_than_saving_what_backward_reads():
    args = mlp_args()
    min_cut = training_graph(mlp, args, recompute=True).partition
    save_used = training_graph(mlp, args, recompute=False).partition
    assert 0 < min_cut.saved_bytes < save_used.saved_bytes


@pytest.mark.parametrize("recompute", [True, False])
def test_backward_reads_only_saved_values_and_tangents(recompute):
    tg = training_graph(mlp, mlp_args(), recompute=recompute)
    placeholders = [n for n in tg.partition.backward.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == tg.partition.num_saved + sum(tg.signature.differentiable)


def test_matmuls_are_not_recomputed():
    tg = training_graph(mlp, mlp_args())
    assert aten.addmm.default in targets(tg.partition.forward)
    assert aten.addmm.default not in targets(tg.partition.backward)


def test_cheap_pointwise_ops_are_recomputed():
    tg = training_graph(mlp, mlp_args())
    backward = targets(tg.partition.backward)
    assert aten.tanh.default in backward or aten.gelu.default in backward or aten.erf.default in backward


def test_random_ops_stay_in_forward():
    def f(x, w):
        return F.dropout(torch.sin(x @ w), 0.5, training=True).sum()
    tg = training_graph(f, [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)])
    random = [t for t in targets(tg.partition.backward)
              if isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags]
    assert not random
    assert any(torch.Tag.nondeterministic_seeded in t.tags for t in targets(tg.partition.forward)
               if isinstance(t, torch._ops.OpOverload))


@pytest.mark.parametrize("recompute", [True, False])
def test_written_input_is_saved_as_its_old_value(recompute):
    def f(x, w, buf):
        y = (x * buf * w).sum()   # the gradient of w reads buf's value before the write
        buf.add_(1)
        return y
    args = [torch.randn(5), torch.randn(5, requires_grad=True), torch.randn(5)]
    tg = training_graph(f, [a.detach().clone().requires_grad_(a.requires_grad) for a in args], recompute)
    fresh = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    tg(*fresh).backward()
    torch.testing.assert_close(fresh[1].grad, (args[0] * args[2]).detach())
    torch.testing.assert_close(fresh[2], (args[2] + 1).detach())
