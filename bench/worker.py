"""The process that runs workloads, apart from `python -m bench` (see bench/suite.py, its supervisor).

`python -m bench.worker FD` reads a `Job` (JSON) on stdin and reports on file descriptor FD, one JSON
message a line: {"event": "start", "workload": NAME}, {"event": "note", "text": STAGE} and
{"event": "result", "result": {...}}. Its own stdout and stderr are free for whatever kiln, torch or the
workloads print.
"""
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from bench import coldwarm
from bench.compilers import COMPILERS
from bench.harness import Settings, run_workload
from bench.machine import set_threads
from bench.results import result_to_dict
from bench.workloads import BY_NAME, Workload


@dataclass
class Job:
    workloads: list[str]
    compilers: list[str]          # without eager: eager always runs
    settings: dict                # a harness.Settings as a dict
    threads: int
    cold_warm: bool
    compile_timeout_s: float
    cold_warm_until: float        # wall-clock time (time.time()) after which cold/warm is left out

    def to_json(self):
        return json.dumps(asdict(self))


def main(fd):
    job = Job(**json.load(sys.stdin))
    channel = os.fdopen(fd, "w", buffering=1)  # line-buffered: each message leaves at once

    def send(**message):
        channel.write(json.dumps(message) + "\n")

    set_threads(job.threads)
    compilers = [COMPILERS[name] for name in job.compilers]
    send(event="note", text="warming up the compilers")
    warm_up_compilers(compilers)
    for name in job.workloads:
        send(event="start", workload=name)
        start, workload = time.perf_counter(), BY_NAME[name]
        result = run_workload(workload, compilers, Settings(**job.settings),
                              note=lambda text: send(event="note", text=text))
        if job.cold_warm and workload.cold_warm and not result.skipped and not result.error:
            _add_cold_warm(result, workload, compilers, job, lambda text: send(event="note", text=text))
        result.wall_s = time.perf_counter() - start
        send(event="result", result=result_to_dict(result))


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


def _add_cold_warm(result, workload, compilers, job, note):
    for compiler in compilers:
        m = result.measurements.get(compiler.name)
        if m is None or m.error:  # it did not even compile in this process: nothing to time
            continue
        if time.time() > job.cold_warm_until:
            m.cold_warm_error = "left out: the run was past 80% of --max-minutes"
            continue
        note(f"{compiler.name}: cold and warm compile")
        times = coldwarm.measure(workload.name, compiler.name, job.threads, job.compile_timeout_s)
        m.cold_s, m.warm_s, m.cold_warm_error = times.cold_s, times.warm_s, times.error


if __name__ == "__main__":
    main(int(sys.argv[1]))
