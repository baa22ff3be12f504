"""Per-call overhead of capture (backend "eager"): kiln vs torch.compile, in one process.

    python bench/capture_overhead.py [--calls 20000]

1. `x + 1` on a 10-element tensor: microseconds per call (eager, kiln, torch.compile).
2. A 12-layer MLP module (Linear+ReLU x 12, no_grad): per call, and the guard check alone (kiln's, and
   torch.compile's where its debug accessor for cache entries exists).
Timings are the best of many short interleaved windows (a long window on a shared machine is rarely
left alone, so its mean measures the load more than the code).
"""
import argparse
import gc
import time
import types

import torch

import kiln


def best_us(fn, arg, calls, window=200):
    """Microseconds per call of fn(arg): the best of short windows (~`window` calls) over about `calls`
    calls. On a shared machine a short window often runs without being preempted; a long one rarely."""
    return best_of({"fn": fn}, arg, calls, window)["fn"]


def best_of(fns, arg, calls, window=200):
    """{name: microseconds per call}: each fn(arg) timed in short windows, interleaved, best window kept."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(max(3, calls // window)):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(window):
                fn(arg)
            best[name] = min(best[name], (time.perf_counter() - start) / window * 1e6)
    return best


def compare(label, eager, kiln_fn, torch_fn, arg, calls, window=200):
    for fn in (eager, kiln_fn, torch_fn):  # warm up: compile, caches
        for _ in range(50):
            fn(arg)
    times = best_of({"eager": eager, "kiln": kiln_fn, "torch.compile": torch_fn}, arg, calls, window)
    print(f"{label}: " + ", ".join(f"{k} {v:.2f} us" for k, v in times.items()) +
          f"  (kiln / torch.compile = {times['kiln'] / times['torch.compile']:.2f}; above eager: kiln "
          f"{times['kiln'] - times['eager']:.2f} us, torch.compile {times['torch.compile'] - times['eager']:.2f} us)")
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    calls = parser.parse_args().calls

    def add_one(x):
        return x + 1
    x = torch.randn(10)
    compare("x + 1, 10 elements", add_one, kiln.compile(add_one, backend="eager"),
            torch.compile(add_one, backend="eager"), x, calls)

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(*[m for _ in range(12) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())])
    compiled = kiln.compile(mlp, backend="eager")
    with torch.no_grad():
        xm = torch.randn(4, 16)
        torch_mlp = torch.compile(mlp, backend="eager")  # kept alive: its guard check is timed below
        compare("12-layer MLP, 4x16", mlp, compiled, torch_mlp, xm, calls // 10, window=20)
        cache = compiled._compiled_call._kiln_cache
        entry, F = cache.entries[0], compiled._compiled_call._kiln_fn
        L = ((xm,), {})
        assert entry.check(F, L)
        guard = best_us(lambda L: entry.check(F, L), L, calls)
        print(f"12-layer MLP guard check (kiln, {len(entry.guards)} guards): {guard:.2f} us")
        torch_guard = torch_guard_us(mlp, xm, calls)
        if torch_guard is not None:
            print(f"12-layer MLP guard check (torch.compile): {torch_guard:.2f} us  "
                  f"(kiln / torch.compile = {guard / torch_guard:.2f})")


def torch_guard_us(mod, x, calls):
    """torch.compile's guard check alone for the cache entry of the frame it compiled for `mod(x)`
    (its debug accessors: the frame is mod.forward or, in newer torch, a wrapper taking *args,
    **kwargs); None where this torch has no such accessor."""
    try:
        from torch._dynamo.convert_frame import input_codes
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return None
    candidates = {("self", "input"): {"self": mod, "input": x}, ("args", "kwargs"): {"args": (x,), "kwargs": {}}}
    for ref in list(input_codes.seen):
        code = ref() if callable(ref) else ref
        f_locals = candidates.get(tuple(code.co_varnames[:2])) if code is not None else None
        entries = _debug_get_cache_entry_list(code) if f_locals is not None else []
        for fn in gc.get_referrers(code) if entries else ():  # the frame's free variables are its locals too
            if isinstance(fn, types.FunctionType) and fn.__closure__:
                f_locals.update(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__)))
                if entries[0].guard_manager.check(f_locals):
                    return best_us(entries[0].guard_manager.check, f_locals, calls)
        if entries and entries[0].guard_manager.check(f_locals):
            return best_us(entries[0].guard_manager.check, f_locals, calls)
    return None

if __name__ == "__main__":
    main()
