"""Run scenario functions on N processes joined in a gloo process group over 127.0.0.1.

`run(world_size, scenarios)` starts `world_size` fresh Python processes (spawned, so the test
process's threads and state are not inherited), each joining one process group on a free port with
a bounded collective timeout, and runs the named scenarios (functions in tests/distributed/
scenarios.py) one after another, each on every rank; it returns {scenario: [result of rank 0, 1,
...]}. A scenario that raises on any rank fails the run with that rank's traceback; a hang is cut
off by the collective timeout inside the processes and by `timeout_s` outside them.
Starting processes costs seconds (each imports torch and kiln), so one run serves many scenarios.
"""
import datetime
import os
import socket
import subprocess
import sys
import tempfile
import traceback

import torch

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gloo_available():
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world_size, scenarios, timeout_s=240, env=None):
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kiln-dist-") as out:
        child_env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                     "OMP_NUM_THREADS": "1", **(env or {})}
        procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.launcher", str(rank), str(world_size),
                                   str(port), out, ",".join(scenarios)], cwd=ROOT, env=child_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(world_size)]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=timeout_s)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"distributed run of {scenarios} did not finish in {timeout_s}s")
        failed = [(rank, log) for rank, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
        if failed:
            rank, log = failed[0]
            raise AssertionError(f"rank {rank} failed:\n{log[-6000:]}")
        results = [torch.load(os.path.join(out, f"rank{rank}.pt"), weights_only=False) for rank in range(world_size)]
    return {name: [r[name] for r in results] for name in scenarios}


def _worker(rank, world_size, port, out, names):
    import torch.distributed as dist
    from tests.distributed import scenarios
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=COLLECTIVE_TIMEOUT)
    results = {}
    try:
        for name in names:
            results[name] = getattr(scenarios, name)(rank, world_size)
            dist.barrier()
    finally:
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5].split(","))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # the other ranks' collectives time out rather than wait forever
