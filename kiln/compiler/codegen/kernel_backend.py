"""What the compiler asks of one device's kernel backend (KernelBackend), what a backend returns
(CompiledKernels), and the error a backend raises for a kernel it cannot emit. The backends
(cpp_backend, triton_backend) build on these; backend.py picks one per device.
"""
import dataclasses
from typing import Callable, Optional


class BackendUnsupported(Exception):
    """A backend cannot emit a kernel of this graph: the graph runs through aten (a speed cost,
    named under KILN_LOGS=perf_hints, never a wrong answer)."""


class KernelBackend:
    """What the compiler asks of a device's kernel backend."""
    name = ""
    one_pass_variance = False  # whether its kernels compute welford_m2 reductions (ir.REDUCTION_TYPES)

    def reaches(self, device) -> bool:
        """Whether this backend's kernels may touch memory of `device` here (installed, enabled)."""
        raise NotImplementedError

    def can_fuse(self, kernel, node) -> bool:
        """Whether `node` may join `kernel` beyond the scheduler's own rules."""
        return True

    def plan_storage(self, program, kernels):
        """Change the storage classes of `kernels`' buffers where this backend keeps values
        differently (before the memory plan). Raises BackendUnsupported for a kernel it cannot emit."""

    def compile(self, program, memory, options, symbols, kernels) -> "CompiledKernels":
        """Code for `kernels` (this backend's, in program order) and the entries the wrapper calls."""
        raise NotImplementedError


@dataclasses.dataclass
class CompiledKernels:
    """One backend's code for a graph: `entries` (each has `.kernels`, in order, and
    `.uses_workspace`), the source (for inspection and logs), and how the wrapper calls an entry."""
    backend: str
    entries: list
    source: str
    emit_call: Callable   # (wrapper _Source, entry, float symbol names) -> None: writes the call's lines
    library_name: Optional[str] = None
