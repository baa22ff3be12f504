"""Run the chosen workloads in a worker process (bench/worker.py) and watch it, with a progress bar.

The worker runs the workloads one after another and reports each result as it finishes. If it dies (a
segfault in generated code) or goes silent (a hang in native code, where no Python-level time limit can
reach), the workload it was on becomes an error row and a fresh worker takes the rest: one failure never
costs the run.
"""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict

from tqdm import tqdm

from bench.machine import REPO
from bench.results import WorkloadResult, result_from_dict
from bench.worker import Job

WORKER = [sys.executable, "-m", "bench.worker"]  # + the message file descriptor
SILENCE_SLACK_S = 120  # on top of the longest stage a healthy worker can be silent for


def run_suite(workloads, compilers, settings, *, threads, cold_warm, compile_timeout_s, cold_warm_until_s):
    """Every workload under eager and `compilers`, in the given order. Cold/warm compiles (the slowest part)
    are left out, with a note, once the run is `cold_warm_until_s` old."""
    job = Job(workloads=[w.name for w in workloads], compilers=[c.name for c in compilers],
              settings=asdict(settings), threads=threads, cold_warm=cold_warm,
              compile_timeout_s=compile_timeout_s, cold_warm_until=time.time() + cold_warm_until_s)
    # the longest a healthy worker stays silent: a cold and a warm compile subprocess, or one first call
    silence_limit_s = max(2 * compile_timeout_s, settings.first_call_limit_s) + SILENCE_SLACK_S
    by_name, results = {w.name: w for w in workloads}, {}
    with tqdm(total=len(workloads), unit="workload", file=sys.stderr, dynamic_ncols=True) as bar:
        while len(results) < len(workloads):
            job.workloads = [name for name in by_name if name not in results]
            _supervise(job, by_name, silence_limit_s, bar, results)
            if job.workloads[0] not in results:  # a worker that exits cleanly without finishing one
                for name in job.workloads:
                    results[name] = _failed(by_name[name], "the worker exited before running it")
    return [results[name] for name in by_name]


def _supervise(job, by_name, silence_limit_s, bar, results):
    """Run one worker until it finishes or fails; a failure is charged to the workload it was on."""
    read_fd, write_fd = os.pipe()
    # its own session, so that stopping it also stops the compile subprocesses it started
    worker = subprocess.Popen([*WORKER, str(write_fd)], stdin=subprocess.PIPE, stdout=2, cwd=REPO,
                              pass_fds=(write_fd,), text=True, start_new_session=True)
    os.close(write_fd)
    try:
        worker.stdin.write(job.to_json())
        worker.stdin.close()
        current, failure = _follow(worker, _lines(read_fd), job.workloads[0], silence_limit_s, bar, results)
    finally:
        if worker.poll() is None:  # silent too long, or we were interrupted (Ctrl-C)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    if failure:
        results[current] = _failed(by_name[current], failure)
        bar.update()


def _follow(worker, messages, current, silence_limit_s, bar, results):
    """Read the worker's messages into `results` and the bar; return (workload it was on, why it failed or
    None)."""
    stage = "starting"
    while True:
        try:
            message = messages.get(timeout=silence_limit_s)
        except queue.Empty:
            return current, f"no progress for {silence_limit_s:.0f} s during {stage}: the worker was stopped"
        if message is None:  # the worker closed its end: finished or died
            code = worker.wait()
            return current, None if code == 0 else f"the worker process died ({_exit_reason(code)}) during {stage}"
        if message["event"] == "start":
            current, stage = message["workload"], "building"
            bar.set_description(current)
        elif message["event"] == "note":
            stage = message["text"]
            bar.set_postfix_str(stage, refresh=True)
        elif message["event"] == "result":
            results[current] = result_from_dict(message["result"])
            bar.update()


def _lines(fd):
    """A queue of the JSON messages read from `fd` by a background thread; None once the writer closes."""
    messages = queue.Queue()

    def read():
        with os.fdopen(fd) as channel:
            for line in channel:
                messages.put(json.loads(line))
        messages.put(None)
    threading.Thread(target=read, daemon=True).start()
    return messages


def _exit_reason(code):
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _failed(workload, reason):
    return WorkloadResult(workload.name, workload.description, workload.kind, workload.static_twin, error=reason)
