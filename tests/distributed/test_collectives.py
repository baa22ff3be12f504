"""Collectives written in user code inside a compiled function, on two ranks: captured into the
graph where they have a functional form, a graph break where not; results and the tensors the
collectives write equal eager's on every rank, and every rank compiles the same number of graphs.
"""
import pytest
import torch

from tests.distributed import launcher

pytestmark = pytest.mark.skipif(not launcher.gloo_available(), reason="torch.distributed with gloo is unavailable")

# program -> graphs per rank: captured collectives keep one graph; broadcast and async_op=True break
EXPECTED_GRAPHS = {
    "allreduce_inplace": 1, "functional_allreduce": 1, "functional_gather_scatter": 1, "gather_scatter_inplace": 1,
    "rank_dependent": 1, "allreduce_max_broadcast": 2, "async_allreduce": 2,
    "allreduce_inplace inductor": 1, "functional_gather_scatter inductor": 1, "gather_scatter_inplace inductor": 1,
}


@pytest.fixture
def collectives(two_ranks):
    return two_ranks["collectives"]


@pytest.mark.parametrize("program", sorted(EXPECTED_GRAPHS))
def test_collective_matches_eager(collectives, program):
    for rank_results in collectives:
        result = rank_results[program]
        torch.testing.assert_close(result["compiled"], result["eager"])  # the result and the inputs after the call
        assert result["graphs"] == EXPECTED_GRAPHS[program]
