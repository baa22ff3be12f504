"""Long random-program runs (tests/compiler/test_fuzz_programs.py) with crash isolation.

    python -m tests.compiler.fuzz_driver --shapes static --seed0 100000 --n 3000 [--batch 24]
        [--log run.jsonl] [--timeout 1800]

Programs run in batches (one compiled function, one C++ build per batch: see check_programs) in a
worker process that runs batch after batch, so a batch costs neither a process start nor imports.
Each batch's result is one line the worker prints; a worker that dies (a SIGSEGV in a kernel, an
abort) or stops answering (a hang) costs only the batch it was on: that batch is split into
single programs, which run in a fresh worker to name the seed that crashes, and the rest of the
run continues in a fresh worker. A batch that fails is split the same way inside the worker
(failing_programs), so every failure is named by seed: `python -m tests.compiler.test_fuzz_programs
SEED` (with KILN_FUZZ_SHAPES) prints and minimizes it.

The summary (and the last line of --log) counts programs per outcome: passed, failed (a wrong
answer or an error from kiln), crashed, hung.
"""
import argparse
import collections
import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time

WORKER = "tests.compiler.fuzz_driver"
CHECK = "tests.compiler.fuzz_driver:check_seeds"
STARTUP_SECONDS = 900  # a worker's imports on a busy machine
MARK = "@@fuzz "  # a worker's answers, told apart from anything else the programs print


def check_seeds(seeds, shapes):
    """Run the programs of `seeds` as one batch compiled with `shapes`: [(seed, message)] for the
    programs that fail (each named by running it alone when the batch fails)."""
    from tests.compiler import test_fuzz_programs as fuzz
    programs = [fuzz.program(s, prefix=f"p{s}_") for s in seeds]
    options = fuzz.batch_options(seeds[0], shapes)
    try:
        fuzz.check_programs(programs, options)
        return []
    except AssertionError as batch_error:
        alone = [(p.seed, msg) for p, msg in fuzz.failing_programs(programs, options)]
        return alone or [(seeds[0], f"the batch fails, no program alone does: {batch_error}")]


def worker(check_name, shapes):
    """Read units (lists of seeds, one JSON list a line) from stdin, check each, print one JSON
    line per unit: {"start": seeds} before it, {"done": seeds, "failures": [...]} after."""
    module, name = check_name.split(":")
    check = getattr(importlib.import_module(module), name)
    for line in sys.stdin:
        seeds = json.loads(line)
        print(MARK + json.dumps({"start": seeds}), flush=True)
        try:
            failures = check(seeds, shapes)
        except Exception as e:  # noqa: BLE001 - the tester itself broke: report it, keep going
            failures = [(seeds[0], f"tester error {type(e).__name__}: {e}")]
        print(MARK + json.dumps({"done": seeds, "failures": failures}), flush=True)


class Worker:
    """One worker process and a thread that reads its answers into a queue."""

    def __init__(self, check_name, shapes):
        cmd = [sys.executable, "-m", WORKER, "--worker", "--check", check_name, "--shapes", shapes]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.answers = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self.answers.put(json.loads(line[len(MARK):]))
        self.answers.put(None)  # the process ended

    def run(self, seeds, timeout):
        """{"failures": [...]} for the unit, or {"crash": how} when the worker died on it or took
        longer than `timeout` seconds from its start (then it is killed: "hung")."""
        try:
            self.proc.stdin.write(json.dumps(seeds) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"crash": self._ended()}
        deadline = None  # the worker may still be starting (imports): the clock starts with the unit
        while True:
            try:
                wait = STARTUP_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
                answer = self.answers.get(timeout=wait)
            except queue.Empty:
                self.close()
                return {"crash": f"no answer in {timeout} s (killed)", "hung": True}
            if answer is None:
                return {"crash": self._ended()}
            if answer.get("start") == seeds:
                deadline = time.monotonic() + timeout
            if answer.get("done") == seeds:
                return answer

    def _ended(self):
        rc = self.proc.wait()
        return f"worker ended with {'signal ' + str(-rc) if rc < 0 else 'exit code ' + str(rc)}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run(seed0, n, batch, shapes, timeout=1800, check_name=CHECK, log=None, say=print):
    """Check programs seed0 .. seed0+n-1 in batches; return the counts (see the module doc) and
    the named failures, crashes and hangs."""
    units = collections.deque([list(range(s, min(s + batch, seed0 + n))) for s in range(seed0, seed0 + n, batch)])
    result = {"shapes": shapes, "seed0": seed0, "n": n, "passed": 0, "failed": [], "crashed": [], "hung": []}
    worker, started = None, time.monotonic()
    while units:
        seeds = units.popleft()
        worker = worker or Worker(check_name, shapes)
        answer = worker.run(seeds, timeout)
        if "crash" in answer:
            worker.close()
            worker = None
            if len(seeds) > 1:  # name the program: run the batch's programs one by one
                units.extendleft(reversed([[s] for s in seeds]))
                say(f"seeds {seeds[0]}-{seeds[-1]}: {answer['crash']}; running them one by one")
                continue
            result["hung" if answer.get("hung") else "crashed"].append((seeds[0], answer["crash"]))
            say(f"seed {seeds[0]}: {answer['crash']}")
        else:
            failed = {s for s, _ in answer["failures"]}
            result["failed"] += [tuple(f) for f in answer["failures"]]
            result["passed"] += len([s for s in seeds if s not in failed])
            for s, msg in answer["failures"]:
                say(f"seed {s} FAILED ({shapes}): {msg[:2000]}")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"seeds": seeds, **answer}) + "\n")
    if worker:
        worker.close()
    result["seconds"] = round(time.monotonic() - started)
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"summary": result}) + "\n")
    return result


def summary(result):
    return (f"{result['shapes']}: seeds {result['seed0']}..{result['seed0'] + result['n'] - 1}: "
            f"{result['passed']} passed, {len(result['failed'])} failed, {len(result['crashed'])} crashed, "
            f"{len(result['hung'])} hung ({result['seconds']} s)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", choices=("static", "dynamic", "automatic", "mixed"), default="mixed")
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one unit may take before it counts as hung")
    ap.add_argument("--log")
    ap.add_argument("--check", default=CHECK)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.check, args.shapes)
    result = run(args.seed0, args.n, args.batch, args.shapes, args.timeout, args.check, args.log)
    print(summary(result))
    return 1 if result["failed"] or result["crashed"] or result["hung"] else 0


if __name__ == "__main__":
    sys.exit(main())
