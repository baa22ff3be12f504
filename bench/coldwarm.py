"""Cold and warm compile time, each in a fresh Python process.

cold: empty compile caches (kiln's KILN_CACHE_DIR, torch.compile's TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR all point into a new temporary folder); warm: a second fresh process with the caches the
cold one left. Each process builds the workload, runs it eagerly once (so torch's own lazy start-up is not
charged to the compiler), then times the first compiled call.

`python -m bench.coldwarm WORKLOAD COMPILER THREADS` is the child: it prints a line
`bench-result {"first_call_s": ...}` (marked, since kiln or torch may print to stdout too).
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from bench.machine import REPO, cache_environment, thread_environment


_MARK = "bench-result "


@dataclass
class ColdWarm:
    cold_s: float | None = None
    warm_s: float | None = None
    error: str | None = None


def measure(workload_name, compiler_name, threads, timeout_s):
    """Cold then warm first-call time of one compiler on one workload, in two fresh processes."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-cache-") as root:
        env = {**os.environ, **cache_environment(root), **thread_environment(threads)}
        result = ColdWarm()
        try:
            result.cold_s = _child(workload_name, compiler_name, threads, env, timeout_s)
            result.warm_s = _child(workload_name, compiler_name, threads, env, timeout_s)
        except ChildFailed as e:
            result.error = str(e)
        return result


class ChildFailed(Exception):
    pass


def _child(workload_name, compiler_name, threads, env, timeout_s):
    command = [sys.executable, "-m", "bench.coldwarm", workload_name, compiler_name, str(threads)]
    try:
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"compile subprocess took over {timeout_s:.0f} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise ChildFailed(f"compile subprocess failed: {lines[-1][:200]}")
    found = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if not found:
        raise ChildFailed("compile subprocess printed no result")
    return json.loads(found[-1][len(_MARK):])["first_call_s"]


def _child_main(workload_name, compiler_name, threads):
    import torch

    from bench.compilers import COMPILERS, EAGER, prepare
    from bench.machine import set_threads
    from bench.workloads import BY_NAME

    set_threads(threads)
    workload, compiler = BY_NAME[workload_name], COMPILERS[compiler_name]
    case = workload.build()
    with torch.enable_grad() if workload.training else torch.no_grad():
        case.run(prepare(EAGER, case.model, workload))
        compiled = prepare(compiler, case.model, workload)
        begin = time.perf_counter()
        case.run(compiled)
        first_call_s = time.perf_counter() - begin
    print(_MARK + json.dumps({"first_call_s": first_call_s}), flush=True)


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
