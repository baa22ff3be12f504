"""Run the chosen workloads one after another, with a progress bar, adding cold/warm compile times."""
import sys
import time

from tqdm import tqdm

from bench import coldwarm
from bench.harness import run_workload


def run_suite(workloads, compilers, settings, *, threads, cold_warm, compile_timeout_s, cold_warm_until_s):
    """Every workload under eager and `compilers`; a failure in one becomes its error row, never a stop.
    Cold/warm compiles (the slowest part) are left out, with a note, once the run is `cold_warm_until_s` old,
    so that a loaded machine stretches the run less."""
    results, run_start = [], time.perf_counter()
    bar = tqdm(workloads, unit="workload", file=sys.stderr, dynamic_ncols=True)
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
