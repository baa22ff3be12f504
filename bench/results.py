"""What a run produces: one `Measurement` per (workload, compiler), grouped into `WorkloadResult`s, plus the
`RunInfo` that says where and how the run happened. Plain dataclasses, so --json is `asdict`."""
import statistics
from dataclasses import asdict, dataclass, field


@dataclass
class Measurement:
    """One compiler on one workload. Times are seconds; None means not measured."""
    compiler: str
    samples_s: list[float] = field(default_factory=list)  # per-call time of each interleaved sample
    calls: int = 0                      # timed calls in all
    first_call_s: float | None = None   # the first call in this process: capture + compile + one run
    cold_s: float | None = None         # first call in a fresh process with empty compile caches
    warm_s: float | None = None         # first call in a fresh process with the caches the cold one left
    max_abs_diff: float | None = None   # vs eager, over every output tensor (and gradient, when training)
    passed: bool | None = None
    saved_mb: float | None = None       # tensors saved for backward in one training step (unique storages)
    error: str | None = None
    cold_warm_error: str | None = None  # why cold/warm could not be measured (the rest still stands)

    @property
    def median_s(self):
        return statistics.median(self.samples_s) if self.samples_s else None

    @property
    def spread(self):
        """Interquartile range over the median: how noisy the samples were."""
        if len(self.samples_s) < 4:
            return None
        q1, _, q3 = statistics.quantiles(self.samples_s, n=4)
        return (q3 - q1) / self.median_s


@dataclass
class WorkloadResult:
    name: str
    description: str
    kind: str
    static_twin: str | None = None      # the workload that runs the same call compiled static
    measurements: dict[str, Measurement] = field(default_factory=dict)
    skipped: str | None = None          # why the workload did not run at all (e.g. a missing module)
    error: str | None = None            # why it failed before any compiler ran (e.g. building it raised)
    wall_s: float = 0.0

    def speedup(self, compiler):
        """Eager time over this compiler's time (above 1: faster than eager)."""
        eager, other = self.median("eager"), self.median(compiler)
        return eager / other if eager and other else None

    def median(self, compiler):
        m = self.measurements.get(compiler)
        return m.median_s if m and not m.error else None


@dataclass
class RunInfo:
    command: str
    started_utc: str
    wall_s: float
    machine: dict
    settings: dict


def to_json(info, results):
    return {"info": asdict(info), "results": [result_to_dict(r) for r in results]}


def from_json(data):
    """Rebuild results from a --json file (for --compare)."""
    return [result_from_dict(d) for d in data["results"]]


_DERIVED = ("median_s", "spread")  # written for readers of the JSON, recomputed on load


def result_to_dict(result):
    d = asdict(result)
    for name, m in result.measurements.items():
        d["measurements"][name].update({key: getattr(m, key) for key in _DERIVED})
    return d


def result_from_dict(d):
    d = dict(d)
    measurements = {name: Measurement(**{k: v for k, v in m.items() if k not in _DERIVED})
                    for name, m in d.pop("measurements").items()}
    return WorkloadResult(measurements=measurements, **d)
