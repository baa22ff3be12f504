"""FSDP2 (`fully_shard` on each hidden layer and the root) compiled by kiln, against eager FSDP2 on
two ranks: losses, full (gathered) gradients and parameters after several SGD steps.

FSDP2's forward hooks all-gather and free the sharded parameters; a call of an FSDP module runs
natively (hooks included) around its compiled forward. The graphs per rank: one per hidden layer's
forward (each guarded on its layer); the root forward, whose loop calls the layers, runs eagerly.
"""
import pytest

from tests.distributed import launcher
from tests.distributed.test_ddp import assert_trained_alike, graphs

pytestmark = pytest.mark.skipif(not launcher.gloo_available(), reason="torch.distributed with gloo is unavailable")


@pytest.fixture
def fsdp(two_ranks):
    return two_ranks["fsdp"]


@pytest.mark.parametrize("variant, expected_graphs", [
    ("plain", 4),
    ("inductor", 4),  # kiln's compiler: forward and backward of each layer compiled
    ("checkpoint", 5),  # each layer's function under torch.utils.checkpoint, and the head
])
def test_fsdp2_matches_eager(fsdp, variant, expected_graphs):
    results = [r[variant] for r in fsdp]
    for result in results:
        assert_trained_alike(result)
    assert graphs(results) == [expected_graphs] * 2
