"""Tuning Triton kernels' launch configs (XBLOCK, RBLOCK, num_warps) at each launch's first call at
each size, the result kept in the process and on disk (KILN_CACHE_DIR/autotune), so a later compile
or process launches it without benchmarking. Two searches, as the options ask:

- max_autotune: every candidate config benchmarked, the fastest kept (`candidates`);
- coordinate_descent_tuning: from the heuristic's config (or max_autotune's pick, when both are on),
  one knob at a time doubled or halved, a move kept when it is faster, until no move is
  (`coordinate_descent`): it reaches configs outside the candidate list, at few benchmarks.

A kernel's source does not depend on its blocks (they are constexpr parameters), so every config
computes the same values; what differs is speed. Every config tried keeps what the source assumes
(`legal`): a persistent reduction's RBLOCK covers its whole row. Benchmarks run on copies of the
tensors the kernel takes, so a kernel that accumulates into a buffer or writes an input leaves the
real ones as one launch leaves them. The timer is a parameter: on a GPU Triton's `do_bench`, in
tests a fake (under the interpreter, timings mean nothing).
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
        blocks = [(x, r) for r in LOOPED_RBLOCKS for x in _powers_of_2(1, 8)]
    found = [default]
    for x, r in blocks:
        for warps in WARPS:
            config = Config(x, r, warps)
            if config not in found and legal(config, default, kind, numel):
                found.append(config)
    return found


def legal(config, default, kind, numel=None):
    """Whether a launch whose heuristic config is `default` may take `config`: RBLOCK is the
    default's unless the rows are looped (then one of LOOPED_RBLOCKS' range); a reduction block
    holds at most MAX_BLOCK_ELEMENTS, a pointwise one at most the widest of POINTWISE_XBLOCKS; no
    block wider than the work past the first that covers it; no more threads than elements."""
    x, r, warps = config.xblock, config.rblock, config.num_warps
    if not all(v >= 1 and v & (v - 1) == 0 for v in (x, r, warps)):
        return False
    if kind == "looped":
        if not min(LOOPED_RBLOCKS) <= r <= max(LOOPED_RBLOCKS):
            return False
    elif r != default.rblock:
        return False
    if x > (max(POINTWISE_XBLOCKS) if kind == "pointwise" else max(1, MAX_BLOCK_ELEMENTS // r)):
        return False
    if numel is not None and x > max(1, _next_power_of_2(numel)):
        return False
    return warps <= max(WARPS) and warps * 32 <= max(32, x * r)


KNOBS = ("xblock", "rblock", "num_warps")
IMPROVEMENT = 0.01  # a move must be this much faster (relative): smaller differences are noise


def coordinate_descent(start, default, kind, numel, time_of):
    """The config coordinate descent reaches from `start`: each knob in turn doubled and halved
    (within `legal`), a move kept when `time_of(config)` beats the best so far by IMPROVEMENT;
    rounds repeat until one moves nothing. `time_of` is called once per config, `start` first."""
    times = {start: time_of(start)}
    best, moved = start, True
    while moved:
        moved = False
        for knob in KNOBS:
            value = getattr(best, knob)
            for step in (value * 2, value // 2):
                config = dataclasses.replace(best, **{knob: step})
                if config in times or not legal(config, default, kind, numel):
                    continue
                times[config] = time_of(config)
                if times[config] < times[best] * (1 - IMPROVEMENT):
                    best, moved = config, True
                    break
    return best


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
    """Launches one @triton.jit function with the config its searches pick at each (numel, rnumel):
    `self(numel, rnumel, *args)`. `searches` holds "max_autotune" and/or "coordinate_descent" (in
    that order: descent starts from max_autotune's pick). `identity` names the kernel (its source,
    the function, the device, Triton's version): with the sizes and searches, the disk cache's key."""

    def __init__(self, fn, name, default, kind, identity, cache, timer, searches=("max_autotune",)):
        self.fn, self.name, self.default, self.kind = fn, name, default, kind
        self.identity, self.cache, self.timer, self.searches = identity, cache, timer, tuple(searches)
        self.chosen = {}   # (numel, rnumel) -> Config

    def __call__(self, numel, rnumel, *args):
        config = self.chosen.get((numel, rnumel))
        if config is None:
            config = self.chosen[(numel, rnumel)] = self.choose(numel, rnumel, args)
        self.fn[config.grid(numel)](*args, XBLOCK=config.xblock, RBLOCK=config.rblock, num_warps=config.num_warps)

    def choose(self, numel, rnumel, args):
        key = f"{self.identity}|{numel}|{rnumel}|{'+'.join(self.searches)}"
        config = self.cache.get(key)
        if config is not None:
            return config
        time_of = Benchmark(self, numel, args)
        config = self.default
        if "max_autotune" in self.searches:
            configs = candidates(self.default, self.kind, numel)
            if len(configs) > 1:  # ties (and configs that raise, timed inf) go to the earliest
                config = min(configs, key=lambda c: (time_of(c), configs.index(c)))
        if "coordinate_descent" in self.searches:
            config = coordinate_descent(config, self.default, self.kind, numel, time_of)
        if time_of.times:
            log("perf_hints", "tuned %s at %s elements (%s): %s of %d configs", self.name, numel,
                " then ".join(self.searches), config, len(time_of.times))
        self.cache.put(key, config)
        return config


class Benchmark:
    """Milliseconds per launch of one AutotunedLaunch at one size with a given config, each config
    timed once, on copies of the launch's tensors; inf for a config the GPU refuses (too many
    registers)."""

    def __init__(self, tuned, numel, args):
        import torch
        self.tuned, self.numel = tuned, numel
        self.scratch = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        self.times = {}

    def __call__(self, config):
        if config not in self.times:
            self.times[config] = self.measure(config)
        return self.times[config]

    def measure(self, config):
        fn, scratch = self.tuned.fn, self.scratch

        def launch():
            fn[config.grid(self.numel)](*scratch, XBLOCK=config.xblock, RBLOCK=config.rblock,
                                        num_warps=config.num_warps)
        try:
            return self.tuned.timer(launch, config)
        except Exception as e:  # noqa: BLE001 - a config the GPU refuses is no candidate
            log("perf_hints", "autotuning %s: config %s raised %s", self.tuned.name, config, e)
            return float("inf")
