"""The seam between the scheduled program and the code that runs its kernels: a kernel backend per
device type.

Every buffer records its device (`ir.Layout.device`). Lowering asks `DeviceBackends.for_device`
whether a node's device has a backend whose kernels can reach its memory; a node on a device
without one (meta, or cuda without Triton) runs through aten, never through another device's
backend. Scheduling fuses only nodes of one device, and asks that device's backend
(`can_fuse`); `compile` hands each backend the kernels of its devices; the wrapper launches each
entry through the `CompiledKernels` that made it.

Backends: "cpp" (C++/OpenMP: CPU memory only, codegen/cpp_backend.py) and "triton" (CUDA memory,
or CPU memory under Triton's interpreter, TRITON_INTERPRET=1: codegen/triton_backend.py). The
option `device_backend` maps device types to backends over `DEFAULT_DEVICE_BACKENDS`;
`{"cpu": "triton"}` sends CPU graphs through Triton, which is how the Triton backend is tested on
a machine without a GPU.
"""
from typing import Optional

from kiln.compiler.codegen.kernel_backend import KernelBackend
from kiln.compiler.schedule import Kernel

DEFAULT_DEVICE_BACKENDS = {"cpu": "cpp", "cuda": "triton"}


def backend_named(name):
    if name == "cpp":
        from kiln.compiler.codegen.cpp_backend import CppBackend
        return CppBackend()
    if name == "triton":
        from kiln.compiler.codegen.triton_backend import TritonBackend
        return TritonBackend()
    raise ValueError(f"no kernel backend {name!r}")


class DeviceBackends:
    """The kernel backend of each device type for one compile (options["device_backend"])."""

    def __init__(self, options):
        self.names = {**DEFAULT_DEVICE_BACKENDS, **dict(options.get("device_backend") or ())}
        self._backends = {}

    def for_device(self, device) -> Optional[KernelBackend]:
        """The backend whose kernels compute on `device`, or None: its ops run through aten."""
        name = self.names.get(device.type)
        if name is None:
            return None
        if name not in self._backends:
            self._backends[name] = backend_named(name)
        backend = self._backends[name]
        return backend if backend.reaches(device) else None

    def of_kernel(self, kernel):
        device = kernel_device(kernel)
        backend = self.for_device(device)
        if backend is None:  # lowering sends every op of such a device to aten: a kiln bug
            raise AssertionError(f"{kernel.name} computes on {device}, which has no kernel backend")
        return backend

    def can_fuse(self, kernel, node):
        return (node.layout.device == kernel_device(kernel)
                and self.of_kernel(kernel).can_fuse(kernel, node))

    def by_backend(self, program):
        """[(backend, its kernels in program order)], backends in order of first kernel."""
        groups = {}
        for step in program.steps:
            if isinstance(step, Kernel):
                backend = self.of_kernel(step)
                groups.setdefault(id(backend), (backend, []))[1].append(step)
        return list(groups.values())

    def plan_storage(self, program):
        for backend, kernels in self.by_backend(program):
            backend.plan_storage(program, kernels)

    def compile(self, program, memory, options, symbols):
        return [backend.compile(program, memory, options, symbols, kernels)
                for backend, kernels in self.by_backend(program)]


def kernel_device(kernel):
    return kernel.nodes[0].layout.device
