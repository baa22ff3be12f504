"""Run one workload under every compiler: first call, check against eager, interleaved timing, memory.

Timing is interleaved (eager, kiln, torch, eager, kiln, torch, ... with the starting compiler rotating each
round), so that a burst of load from other processes hits every compiler alike and the ratios stay fair.
"""
import contextlib
import functools
import gc
import math
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from bench.compilers import EAGER, prepare
from bench.results import Measurement, WorkloadResult


@dataclass(frozen=True)
class Settings:
    budget_s: float = 1.0         # timed seconds per compiler per workload (about)
    min_rounds: int = 5
    max_rounds: int = 2000
    sample_floor_s: float = 2e-3  # a sample is a block of calls lasting at least this (tiny calls)
    warmup_calls: int = 2         # untimed calls after the first, before timing
    first_call_limit_s: float = 300  # a compile that hangs becomes an error row instead of stopping the run


def run_workload(workload, compilers, settings, note=lambda text: None):
    """Measure `workload` with eager and `compilers`; never raises (a failure becomes an error row).
    `note(text)` is told which stage is running (for the progress bar)."""
    start = time.perf_counter()
    result = WorkloadResult(workload.name, workload.description, workload.kind, workload.static_twin)
    missing = workload.missing_modules()
    if missing:
        result.skipped = f"needs {', '.join(missing)} (pip install -e '.[bench]')"
        return result
    for compiler in compilers:
        compiler.reset()
    try:
        case = workload.build()
    except Exception as e:
        result.error = describe(e)
        return result
    grad_mode = torch.enable_grad() if workload.training else torch.no_grad()
    with grad_mode:
        models = _first_calls(workload, case, [EAGER, *compilers], result, settings, note)
        calls = {name: functools.partial(case.run, model) for name, model in models.items()}
        note("timing")
        _time_interleaved(calls, workload, settings, result)
        if workload.training:
            note("memory")
            _measure_saved_tensors(calls, models, result)
    result.wall_s = time.perf_counter() - start
    return result


def _first_calls(workload, case, compilers, result, settings, note):
    """Compile and call each once (timing the first call), compare with eager; return the compiled models
    that worked, by compiler name."""
    models, reference = {}, None
    for compiler in compilers:
        note(f"{compiler.name}: first call")
        m = result.measurements[compiler.name] = Measurement(compiler.name)
        try:
            model = prepare(compiler, case.model, workload)
            call = functools.partial(case.run, model)
            with time_limit(settings.first_call_limit_s):
                begin = time.perf_counter()
                out = call()
                m.first_call_s = time.perf_counter() - begin
            if compiler is EAGER:
                reference = out
            elif reference is not None:
                m.max_abs_diff = max_abs_diff(reference, out)
                m.passed = m.max_abs_diff <= workload.atol * max(1.0, max_abs(reference))
            models[compiler.name] = model
        except Exception as e:
            m.error = describe(e)
    return models


def _time_interleaved(calls, workload, settings, result):
    """Warm up, choose how many calls make one sample and how many rounds fill the budget, then take the
    samples round-robin across compilers."""
    estimates = {name: _warm_up(call, settings.warmup_calls, result.measurements[name])
                 for name, call in list(calls.items())}
    live = {name: calls[name] for name in calls if result.measurements[name].error is None}
    if not live:
        return
    fastest, slowest = min(estimates[n] for n in live), max(estimates[n] for n in live)
    per_sample = max(1, math.ceil(settings.sample_floor_s / max(fastest, 1e-9)))
    rounds = math.ceil(settings.budget_s / (per_sample * max(slowest, 1e-9)))
    rounds = max(rounds, math.ceil(workload.min_calls / per_sample), settings.min_rounds)
    rounds = min(rounds, max(settings.max_rounds, math.ceil(workload.min_calls / per_sample)))
    names = list(live)
    gc.collect()
    gc.disable()  # a collection inside one compiler's sample would charge it for everyone's garbage
    try:
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                _take_sample(name, live, per_sample, result.measurements[name])
    finally:
        gc.enable()


def _warm_up(call, count, measurement):
    """Run `count` untimed-in-the-results calls; return the fastest as the time estimate."""
    best = math.inf
    try:
        for _ in range(count):
            begin = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - begin)
    except Exception as e:
        measurement.error = describe(e)
    return best


def _take_sample(name, live, per_sample, measurement):
    if measurement.error:
        return
    call = live[name]
    try:
        begin = time.perf_counter()
        for _ in range(per_sample):
            call()
        measurement.samples_s.append((time.perf_counter() - begin) / per_sample)
        measurement.calls += per_sample
    except Exception as e:
        measurement.error = describe(e)


def _measure_saved_tensors(calls, models, result):
    """Bytes saved for backward in one step, counted by a saved-tensors hook (works the same for eager,
    kiln's and torch.compile's autograd.Functions). Parameters are left out: every compiler saves the same
    weights; what differs is the activations."""
    for name, call in calls.items():
        m = result.measurements[name]
        if m.error:
            continue
        model = models[name]
        params = ({p.untyped_storage().data_ptr() for p in model.parameters()}
                  if isinstance(model, torch.nn.Module) else set())
        storages = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
            return t

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                call()
            m.saved_mb = sum(storages.values()) / 2**20
        except Exception as e:
            m.error = f"while measuring memory: {describe(e)}"


class TimeLimitExceeded(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    """Raise TimeLimitExceeded in the block after `seconds` (SIGALRM, so only in the main thread; elsewhere
    the block runs unlimited)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeLimitExceeded(f"first call took over {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def max_abs_diff(expected, actual):
    """Largest |expected - actual| over all tensors in two nested outputs; NaN/inf in the same place count as
    equal, a structure or shape mismatch is infinite."""
    a = [t for t in tree_leaves(expected) if isinstance(t, torch.Tensor)]
    b = [t for t in tree_leaves(actual) if isinstance(t, torch.Tensor)]
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return math.inf
        if x.numel() == 0:
            continue
        x, y = x.detach().double(), y.detach().double()
        same = (x == y) | (x.isnan() & y.isnan())
        diff = torch.where(same, torch.zeros_like(x), (x - y).abs()).nan_to_num(nan=math.inf).max().item()
        worst = max(worst, diff)
    return worst


def max_abs(output):
    values = [t.detach().abs().max().item() for t in tree_leaves(output)
              if isinstance(t, torch.Tensor) and t.numel() and t.is_floating_point()]
    return max((v for v in values if math.isfinite(v)), default=0.0)


def describe(error):
    """One line: the exception type, its message, where it was raised, and the innermost kiln frame (the
    place to start looking when the raise itself is deep inside torch)."""
    text = str(error).strip()
    message = text.splitlines()[0][:200] if text else ""
    frames = traceback.extract_tb(error.__traceback__)
    places = [frames[-1]] if frames else []
    kiln_frames = [f for f in frames if "/kiln/" in f.filename]
    if kiln_frames and kiln_frames[-1] is not frames[-1]:
        places.append(kiln_frames[-1])
    where = ", via ".join(f"{_short(f.filename)}:{f.lineno}" for f in places)
    return f"{type(error).__name__}: {message}" + (f" ({where})" if where else "")


def _short(filename):
    """kiln/capture/x.py for kiln's files, the bare name for anything else."""
    return "kiln/" + filename.rsplit("/kiln/", 1)[1] if "/kiln/" in filename else filename.rsplit("/", 1)[-1]
