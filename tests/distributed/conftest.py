"""One process-group run per world size serves every test of this directory: starting processes
(each imports torch and kiln) costs more than most scenarios, so all the 2-rank scenarios run in one
launch and all the 4-rank ones in another, on the first test that needs them."""
import pytest

from tests.distributed import launcher

TWO_RANKS = ["ddp_outer", "ddp_inner", "ddp_outer_inductor", "ddp_no_sync", "ddp_find_unused", "ddp_static_graph",
             "ddp_buckets", "ddp_overlap", "ddp_checkpoint", "collectives", "fsdp"]
FOUR_RANKS = ["ddp_outer", "ddp_inner"]


@pytest.fixture(scope="session")
def two_ranks():
    return launcher.run(2, TWO_RANKS)


@pytest.fixture(scope="session")
def four_ranks():
    return launcher.run(4, FOUR_RANKS)
