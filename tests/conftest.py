"""Under pytest-xdist (`-n auto --dist loadgroup`, as the README and CI run the suite) each test file goes
to one worker whole, so a file's module fixtures run once; the files of tests/distributed go together,
since one process-group launch per world size serves all of them (tests/distributed/conftest.py).

Triton's interpreter (TRITON_INTERPRET=1) must be chosen before triton is first imported (triton jits
its own library functions then): on a machine without a GPU, the Triton backend's tests
(tests/compiler/test_triton_backend.py) run kernels under it, on CPU tensors. It is set here, before
any test module is collected: a module that imports torch's own compiler stack (functorch's
aot_module_simplified, in tests/capture/test_user_backends.py) imports triton on the way, and a
worker that collected it first ran every Triton test outside the interpreter ("Cannot call
@triton.jit'd outside of the scope of a kernel")."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        path = item.nodeid.split("::")[0]
        group = "tests/distributed" if path.startswith("tests/distributed/") else path
        item.add_marker(pytest.mark.xdist_group(group))
