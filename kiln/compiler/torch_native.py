"""Small native helpers built against torch's own headers (the tensor guards' checker, the wrapper's
entry calls): where a tensor's Python object keeps its TensorImpl, the flags that build against
torch, and a helper that loads at once where it is built and is otherwise built in a thread, so
that no compile waits for g++ (what asks for it meanwhile takes its Python path)."""
import ctypes
import os
import sysconfig
import threading

import torch

from kiln.debug.logs import log


def impl_offset():
    """Where a tensor's Python object holds its TensorImpl pointer (THPVariable's `cdata`: right after
    the object header, or after MaybeOwned's flag in older torch), confirmed on several tensors; None
    where it is found at neither place."""
    probes = [torch.empty(2, 3), torch.nn.Parameter(torch.empty(3)), torch.empty(4, 5)[1:, ::2]]
    for offset in (16, 24):
        if all(ctypes.c_void_p.from_address(id(t) + offset).value == t._cdata for t in probes):
            return offset
    return None


def build_flags():
    """Compiler flags for a translation unit that includes torch's and Python's headers and links c10."""
    # torch's headers and libraries where its package keeps them (torch.utils.cpp_extension says the
    # same, but importing it brings setuptools: ~80 ms on a warm start that never builds)
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    includes = [f"-I{os.path.join(torch_dir, 'include')}", f"-I{sysconfig.get_paths()['include']}"]
    lib_dir = os.path.join(torch_dir, "lib")
    # (libraries come before the source in build's command line: --no-as-needed keeps c10 linked)
    return ("-w", *includes, f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-Wl,--no-as-needed", "-lc10")


class Helper:
    """A helper library: `source` (TORCH_VERSION in it is replaced by torch's version, so the build
    cache keys on it) and `make(lib, offset)`, which returns what the helper hands out. `get()`: that,
    or None while it is being built or where it cannot be used here."""

    def __init__(self, name, source, make):
        self.name, self.source, self.make = name, source, make
        self._loaded = None    # what make returned once loaded; () where the helper cannot be used
        self._building = None  # the thread building it
        self._lock = threading.Lock()

    def get(self, wait=False):
        """`wait`: wait for a build under way (tests)."""
        if self._loaded is None:
            with self._lock:
                if self._loaded is None and self._building is None:
                    self._loaded = self._load(build=False)
                    if self._loaded is None:
                        self._building = threading.Thread(target=self._build, name=f"kiln-{self.name}", daemon=True)
                        self._building.start()
        if wait and self._building is not None:
            self._building.join()
        return self._loaded or None

    def _build(self):
        found = self._load(build=True)
        self._loaded = () if found is None else found

    def _load(self, build):
        """What make returns; None when the library is not built yet (`build` False); () when it cannot be used."""
        try:
            offset = impl_offset()
            if offset is None:
                log("perf_hints", "%s: a tensor's TensorImpl pointer was not found: not used", self.name)
                return ()
            from kiln.compiler import build as builder
            lib = builder.load_library(self.source.replace("TORCH_VERSION", torch.__version__), name_hint=self.name,
                                       extra_flags=build_flags(), build=build)
            if lib is None:
                return None
            return self.make(lib, offset)
        except Exception as e:  # no compiler, a header that does not compile: the Python path
            log("perf_hints", "%s: native helper unavailable (%s): not used", self.name, e)
            return ()
