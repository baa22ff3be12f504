"""What holding guarded objects weakly costs per call: the same 12-layer MLP compiled twice in one
process, once with today's guards (modules checked through weak references) and once with every
object held plainly; guard check and whole call timed interleaved.

    python -m bench.weak_guards [--repeats 9]
"""
import argparse
import statistics
import time

import torch

import kiln
from kiln.capture import guards


def build(weak):
    held_weakly = guards._held_weakly
    if not weak:
        guards._held_weakly = lambda value: False
    try:
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(*[m for _ in range(12) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())])
        compiled = kiln.compile(mlp, backend="eager")
        x = torch.randn(4, 16)
        compiled(x)
    finally:
        guards._held_weakly = held_weakly
    entry = compiled._compiled_call._kiln_cache.entries[0]
    return compiled, entry, compiled._compiled_call._kiln_fn, ((x,), {}), x


def per_call_us(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    repeats = parser.parse_args().repeats
    torch.set_grad_enabled(False)
    plain, weak = build(False), build(True)
    times = {"guard plain": [], "guard weak": [], "call plain": [], "call weak": []}
    for _ in range(repeats):
        for name, (compiled, entry, F, L, x) in (("plain", plain), ("weak", weak)):
            times[f"guard {name}"].append(per_call_us(lambda: entry.check(F, L), 20000))
            times[f"call {name}"].append(per_call_us(lambda: compiled(x), 2000))
    for what in ("guard", "call"):
        ratios = [w / p for p, w in zip(times[f"{what} plain"], times[f"{what} weak"])]
        print(f"{what}: plain {min(times[f'{what} plain']):.2f} us, weak {min(times[f'{what} weak']):.2f} us "
              f"(best of {repeats}); weak / plain median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
