"""DistributedDataParallel compiled by kiln, in both wrapping orders, against eager DDP.

Every scenario (tests/distributed/scenarios.py) trains the same model eagerly under DDP and
compiled, on every rank of a gloo process group over 127.0.0.1, and returns losses, gradients
and parameters after several SGD steps, and how many graphs kiln compiled on that rank. One
process-group run serves all the scenarios of a world size (conftest.py).
"""
import pytest
import torch

from tests.distributed import launcher

pytestmark = pytest.mark.skipif(not launcher.gloo_available(), reason="torch.distributed with gloo is unavailable")


def assert_trained_alike(result):
    """Compiled training matched eager DDP: losses, gradients and parameters after every step."""
    eager, compiled = result["eager"], result["compiled"]
    for key in ("losses", "grads", "params"):
        torch.testing.assert_close(compiled[key], eager[key], rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")


def graphs(results):
    return [r["graphs"] for r in results]


@pytest.mark.parametrize("order", ["ddp_outer", "ddp_inner"])
def test_ddp_both_orders_match_eager_on_two_ranks(two_ranks, order):
    for result in two_ranks[order]:
        assert_trained_alike(result)
    # kiln.compile(DDP(m)) runs DDP's forward natively and compiles the module it wraps: one graph
    # per rank (it was 0: DDP's forward broke capture and the whole model ran eagerly)
    assert graphs(two_ranks[order]) == [1, 1]


def test_ddp_outer_with_kilns_compiler(two_ranks):
    """kiln's compiler (forward and backward compiled per bucket graph) trains as eager DDP does."""
    for result in two_ranks["ddp_outer_inductor"]:
        assert_trained_alike(result)
    assert graphs(two_ranks["ddp_outer_inductor"]) == [2, 2]


def _layers(*indices):
    return sorted(f"self_modules_layers_modules_{i}_parameters_{p}" for i in indices for p in ("weight", "bias"))


_HEAD = ["self_modules_head_parameters_bias", "self_modules_head_parameters_weight"]


@pytest.mark.parametrize("cap_mb, expected", [
    # a cap below any layer: each layer's graph is a bucket of its own
    (1e-6, [_layers(0), _layers(1), _layers(2), _layers(3), _HEAD]),
    # 0.02 MiB = 20,971 bytes; layers hold 16,640 bytes, the head 520: walking back from the output,
    # head + layer 3 (17,160) is under the cap, so layer 2 joins (33,800); layers 1 and 0 fill the next
    (0.02, [_layers(0, 1), sorted(_HEAD + _layers(2, 3))]),
    (25, [sorted(_HEAD + _layers(0, 1, 2, 3))]),
])
def test_ddp_graph_split_at_buckets(two_ranks, cap_mb, expected):
    for result in two_ranks["ddp_buckets"]:
        assert_trained_alike(result[cap_mb])
        assert result[cap_mb]["graphs"] == len(expected)
        assert result[cap_mb]["params"] == expected


def test_ddp_inner_order_splits_too(two_ranks):
    """DDP(kiln.compile(m)): the module compiles inside DDP's forward, so it is split as well."""
    for result in two_ranks["ddp_buckets"]:
        assert_trained_alike(result["inner"])
        assert result["inner"]["params"] == [_layers(0, 1), sorted(_HEAD + _layers(2, 3))]


def test_ddp_bucket_allreduce_starts_before_backward_ends(two_ranks):
    """With the graph split at buckets, the last layers' bucket is all-reduced before the backward
    reaches the input, as in eager; as one graph, every all-reduce waits for the whole backward."""
    for events in two_ranks["ddp_overlap"]:
        assert events["eager"] == ["allreduce 0", "input grad", "allreduce 1"]
        assert events["split"] == events["eager"]
        assert events["one bucket"] == ["input grad", "allreduce 0"]


@pytest.mark.parametrize("order", ["outer", "inner"])
@pytest.mark.parametrize("scenario", ["ddp_no_sync", "ddp_static_graph"])
def test_ddp_modes_match_eager(two_ranks, scenario, order):
    results = [r[order] for r in two_ranks[scenario]]
    for result in results:
        assert_trained_alike(result)
    assert graphs(results) == [1, 1]


@pytest.mark.parametrize("order", ["outer", "inner"])
def test_ddp_find_unused_parameters_matches_eager(two_ranks, order):
    """A layer used on some steps only (a data-dependent branch, so graph breaks): DDP's unused-
    parameter search walks the compiled graphs' autograd nodes, as it walks eager's."""
    results = [r[order] for r in two_ranks["ddp_find_unused"]]
    for result in results:
        assert_trained_alike(result)
    assert all(n >= 2 for n in graphs(results))


@pytest.mark.parametrize("order", ["ddp_outer", "ddp_inner"])
def test_ddp_both_orders_match_eager_on_four_ranks(four_ranks, order):
    for result in four_ranks[order]:
        assert_trained_alike(result)
    assert graphs(four_ranks[order]) == [1] * 4


@pytest.mark.parametrize("order", ["outer", "inner"])
def test_ddp_with_activation_checkpointing(two_ranks, order):
    """Each hidden layer under torch.utils.checkpoint in a loop: the checkpoint runs natively with
    the checkpointed function compiled (a graph per layer: each is guarded on its layer; the
    recomputation in backward reruns it), and gradients reach DDP's hooks as in eager. (The break
    inside the loop leaves the loop's frame running eagerly, with its callees compiled; it was 0
    graphs before checkpoint's function was compiled from eagerly run frames too.)"""
    results = [r[order] for r in two_ranks["ddp_checkpoint"]]
    for result in results:
        assert_trained_alike(result)
    assert graphs(results) == [4, 4]
