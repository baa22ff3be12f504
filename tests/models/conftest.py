"""Real models: fresh compile caches per test; KILN_TEST_PEER=torch runs them against torch.compile."""
import os

import pytest

import kiln
from tests.utils import use_torch_peer

if os.environ.get("KILN_TEST_PEER") == "torch":
    use_torch_peer()


@pytest.fixture(autouse=True)
def fresh_caches():
    kiln.reset()
    yield
    kiln.reset()
