"""Capture acceptance tests: fresh caches per test, and the torch peer switch.

`KILN_TEST_PEER=torch python -m pytest tests/capture tests/models` runs every test against
torch.compile instead of kiln, to prove the tests themselves right. Tests of kiln-only API
(KILN_LOGS output, kiln's warnings) carry the `kiln_only` marker and are skipped under the peer, as
are kiln's internal tests (tests/capture/internal);
tests where torch.compile itself disagrees with eager carry `torch_differs(reason)` and are
expected to fail under the peer.
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
    config.addinivalue_line("markers", "torch_differs(reason): torch.compile disagrees with eager here")


def pytest_collection_modifyitems(config, items):
    if not PEER:
        return
    for item in items:
        if item.get_closest_marker("kiln_only") or "internal" in item.path.parts:
            item.add_marker(pytest.mark.skip(reason="kiln-only API, not comparable with the torch peer"))
        differs = item.get_closest_marker("torch_differs")
        if differs:
            item.add_marker(pytest.mark.xfail(reason=f"torch.compile differs: {differs.args[0]}", strict=True))


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
