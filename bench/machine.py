"""The run's environment: thread count and compile-cache directories (set the same way for every compiler
and every subprocess), and a description of the machine for the report."""
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Every compile cache kiln and torch.compile keep on disk, by the environment variable that moves it.
CACHE_VARIABLES = {"KILN_CACHE_DIR": "kiln", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def cache_environment(root):
    """Environment entries that put every compile cache under `root` (one subfolder per cache)."""
    return {var: str(Path(root) / sub) for var, sub in CACHE_VARIABLES.items()}


def thread_environment(threads):
    """OpenMP's thread count for generated kernels (kiln's and Inductor's), set before torch starts."""
    return {"OMP_NUM_THREADS": str(threads)}


def set_threads(threads):
    import torch
    torch.set_num_threads(threads)


def describe(threads):
    import torch
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kiln_commit": _git_commit(),
        "load_average": load_average(),
    }


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit():
    commit = _git("rev-parse", "--short", "HEAD")
    if commit is None:
        return "unknown"
    if _git("status", "--porcelain", "--", "kiln"):
        commit += " + uncommitted changes in kiln/"
    return commit


def _git(*args):
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
