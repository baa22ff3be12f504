"""max_autotune for Triton kernels: each launch's candidate block configs (XBLOCK, RBLOCK, num_warps)
benchmarked on its first call at each size, the fastest kept, in the process and on disk
(KILN_CACHE_DIR/autotune), so a later compile or process launches it without benchmarking.

A kernel's source does not depend on its blocks (they are constexpr parameters), so every candidate
computes the same values; what differs is speed. The candidates keep what the source assumes: a
persistent reduction's RBLOCK covers its whole row. Benchmarks run on copies of the tensors the
kernel takes, so a kernel that accumulates into a buffer or writes an input leaves the real
ones as one launch leaves them. The timer is a parameter: on a GPU Triton's `do_bench`, in tests a
fake (under the interpreter, timings mean nothing).
"""
import dataclasses
import hashlib
import json
import os

from kiln.debug.logs import log

POINTWISE_XBLOCKS = (128, 256, 512, 1024, 2048)
LOOPED_RBLOCKS = (64, 128, 256, 512, 1024, 2048)
MAX_BLOCK_ELEMENTS = 8192   # XBLOCK * RBLOCK of a candidate reduction block
WARPS = (2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Config:
    xblock: int
    rblock: int
    num_warps: int

    def grid(self, numel):
        return ((numel + self.xblock - 1) // self.xblock,)


def candidates(default, kind, numel=None):
    """Configs to try for a launch whose heuristic config is `default`; `kind` is "pointwise" (scans
    and scatters too: RBLOCK unused), "persistent" (RBLOCK fixed: it covers the row) or "looped".
    The default comes first (it wins ties)."""
    if kind == "pointwise":
        blocks = [(x, default.rblock) for x in POINTWISE_XBLOCKS]
    elif kind == "persistent":
        blocks = [(x, default.rblock) for x in _powers_of_2(1, MAX_BLOCK_ELEMENTS // default.rblock)]
    else:
        blocks = [(x, r) for r in LOOPED_RBLOCKS for x in _powers_of_2(1, 8) if x * r <= MAX_BLOCK_ELEMENTS]
    if numel is not None:  # no block wider than the work, past the first that covers it
        blocks = [(x, r) for x, r in blocks if x <= max(1, _next_power_of_2(numel))]
    found = [default]
    for x, r in blocks:
        for warps in WARPS:
            if warps * 32 <= max(32, x * r):  # no more threads than elements
                config = Config(x, r, warps)
                if config not in found:
                    found.append(config)
    return found


def _powers_of_2(lo, hi):
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def _next_power_of_2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cuda_timer(launch, config):
    """Milliseconds per call of `launch()` on the GPU (Triton's do_bench: warm-up, repeats, median);
    `config` is what it launches with (for timers that model a cost instead: tests)."""
    from triton.testing import do_bench
    return do_bench(launch, warmup=5, rep=20)


timer = cuda_timer  # tests put a fake here


class DiskCache:
    """{key: config} in one small JSON file per key under `folder` (written atomically)."""

    def __init__(self, folder):
        self.folder = folder

    def _path(self, key):
        return os.path.join(self.folder, hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def get(self, key):
        try:
            with open(self._path(key)) as f:
                data = json.load(f)
            if data.get("key") == key:
                return Config(**data["config"])
        except (OSError, ValueError, TypeError, KeyError):
            pass  # missing or damaged: benchmark again
        return None

    def put(self, key, config):
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        path = self._path(key)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"key": key, "config": dataclasses.asdict(config)}, f)
        os.replace(tmp, path)


class AutotunedLaunch:
    """Launches one @triton.jit function with the fastest of its candidate configs at each
    (numel, rnumel): `self(numel, rnumel, *args)`. `identity` names the kernel (its source, the
    function, the device, Triton's version): with the sizes, the disk cache's key."""

    def __init__(self, fn, name, default, kind, identity, cache, timer):
        self.fn, self.name, self.default, self.kind = fn, name, default, kind
        self.identity, self.cache, self.timer = identity, cache, timer
        self.chosen = {}   # (numel, rnumel) -> Config

    def __call__(self, numel, rnumel, *args):
        config = self.chosen.get((numel, rnumel))
        if config is None:
            config = self.chosen[(numel, rnumel)] = self.choose(numel, rnumel, args)
        self.fn[config.grid(numel)](*args, XBLOCK=config.xblock, RBLOCK=config.rblock, num_warps=config.num_warps)

    def choose(self, numel, rnumel, args):
        key = f"{self.identity}|{numel}|{rnumel}"
        config = self.cache.get(key)
        if config is not None:
            return config
        configs = candidates(self.default, self.kind, numel)
        if len(configs) > 1:
            config = self.benchmark(configs, numel, args)
        else:
            config = configs[0]
        self.cache.put(key, config)
        return config

    def benchmark(self, configs, numel, args):
        import torch
        scratch = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        timings = []
        for config in configs:
            def launch(config=config):
                self.fn[config.grid(numel)](*scratch, XBLOCK=config.xblock, RBLOCK=config.rblock,
                                            num_warps=config.num_warps)
            try:
                timings.append((self.timer(launch, config), configs.index(config), config))
            except Exception as e:  # a config the GPU refuses (too many registers): not a candidate
                log("perf_hints", "autotuning %s: config %s raised %s", self.name, config, e)
        best = min(timings)[2] if timings else self.default
        log("perf_hints", "autotuned %s at %s elements: %s of %d configs", self.name, numel, best, len(configs))
        return best
