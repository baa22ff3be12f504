"""Real models: fresh compile caches per test; KILN_TEST_PEER=torch runs them against torch.compile.

Tests marked `slow` (long compiles of the model zoo with kiln's compiler) run only with
KILN_TEST_SLOW=1, so the default run stays a few minutes on a small CI machine."""
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


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long model compiles; run with KILN_TEST_SLOW=1")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KILN_TEST_SLOW"):
        return
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.skip(reason="slow model compile: set KILN_TEST_SLOW=1 to run it"))
