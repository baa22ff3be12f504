"""Triton's interpreter (TRITON_INTERPRET=1) must be chosen before triton is first imported (triton
jits its own library functions then): on a machine without a GPU, the Triton backend's tests
(test_triton_backend.py) run kernels under it, on CPU tensors. Nothing else here uses Triton."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
