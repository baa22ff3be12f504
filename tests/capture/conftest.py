"""Capture acceptance tests: fresh caches per test, and the torch peer switch.

`KILN_TEST_PEER=torch python -m pytest tests/capture tests/models` runs every test against
torch.compile instead of kiln, to prove the tests themselves right. Tests of kiln-only API
(KILN_LOGS output, kiln's warnings) carry the `kiln_only` marker and are skipped under the peer.
"""
import os

import pytest

import kiln
from kiln.debug.logs import set_logs
from tests.utils import use_torch_peer

PEER = os.environ.get("KILN_TEST_PEER", "")
if PEER == "torch":
    use_torch_peer()
elif PEER:
    raise RuntimeError(f"KILN_TEST_PEER={PEER!r}: the only peer is 'torch'")


def pytest_configure(config):
    config.addinivalue_line("markers", "kiln_only: tests kiln-only API; skipped when KILN_TEST_PEER=torch")


def pytest_collection_modifyitems(config, items):
    if PEER:
        for item in items:
            if item.get_closest_marker("kiln_only"):
                item.add_marker(pytest.mark.skip(reason="kiln-only API, not comparable with the torch peer"))


@pytest.fixture(autouse=True)
def fresh_caches():
    """Every test starts with empty compile caches, so graph counts are its own."""
    kiln.reset()
    yield
    kiln.reset()


@pytest.fixture
def kiln_logs():
    """Turn KILN_LOGS artifacts on for one test (`kiln_logs("graph_breaks")`); all off afterwards."""
    yield set_logs
    set_logs("")
