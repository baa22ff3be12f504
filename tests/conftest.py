"""Under pytest-xdist (`-n auto --dist loadgroup`, as the README and CI run the suite) each test file goes
to one worker whole, so a file's module fixtures run once; the files of tests/distributed go together,
since one process-group launch per world size serves all of them (tests/distributed/conftest.py)."""
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        path = item.nodeid.split("::")[0]
        group = "tests/distributed" if path.startswith("tests/distributed/") else path
        item.add_marker(pytest.mark.xdist_group(group))
