"""Run the chosen workloads one after another, with a progress bar, adding cold/warm compile times."""
import sys
import time

from tqdm import tqdm

from bench import coldwarm
from bench.harness import run_workload
from bench.workloads import Workload


def run_suite(workloads, compilers, settings, *, threads, cold_warm, compile_timeout_s, cold_warm_until_s):
    """Every workload under eager and `compilers`; a failure in one becomes its error row, never a stop.
    Cold/warm compiles (the slowest part) are left out, with a note, once the run is `cold_warm_until_s` old,
    so that a loaded machine stretches the run less."""
    results, run_start = [], time.perf_counter()
    bar = tqdm(workloads, unit="workload", file=sys.stderr, dynamic_ncols=True)
    bar.set_postfix_str("warming up the compilers", refresh=True)
    warm_up_compilers(compilers)
    for workload in bar:
        bar.set_description(workload.name)
        start = time.perf_counter()
        result = run_workload(workload, compilers, settings, progress=bar)
        if cold_warm and workload.cold_warm:
            late = time.perf_counter() - run_start > cold_warm_until_s
            _add_cold_warm(result, workload, compilers, threads, compile_timeout_s, bar, late)
        result.wall_s = time.perf_counter() - start
        results.append(result)
    return results


def warm_up_compilers(compilers):
    """Compile one trivial function with each compiler first, so that the lazy imports and start-up of a
    compiler are not charged to the first workload's first call (cold/warm subprocesses measure those)."""
    import torch

    def trivial(x):
        return x * 2 + 1

    for compiler in compilers:
        try:
            compiler.wrap(trivial, _WARM_UP)(torch.randn(8))
        except Exception:
            pass  # a compiler that cannot even do this fails again, visibly, in the first workload
        compiler.reset()


_WARM_UP = Workload("warm_up", "compiler start-up", build=lambda: None)


def _add_cold_warm(result, workload, compilers, threads, timeout_s, bar, late):
    for compiler in compilers:
        m = result.measurements.get(compiler.name)
        if m is None or m.error:  # it did not even compile in this process: nothing to time
            continue
        if late:
            m.cold_warm_error = "left out: the run was past 80% of --max-minutes"
            continue
        bar.set_postfix_str(f"{compiler.name}: cold/warm compile", refresh=True)
        times = coldwarm.measure(workload.name, compiler.name, threads, timeout_s)
        m.cold_s, m.warm_s, m.cold_warm_error = times.cold_s, times.warm_s, times.error
