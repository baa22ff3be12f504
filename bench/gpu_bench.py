"""eager vs kiln vs torch.compile on CUDA: the programs of bench/gpu_workloads in float32 and bfloat16.

Per row: the median time of one call (CUDA events around a batch of calls, after warm-up), each
compiler's speedup over eager, kiln / torch.compile, and compile time (the first call). Rows past
the time budget are skipped, so the whole run fits the GPU machine's window.

`python -m bench.gpu_bench [--budget SECONDS] [--json FILE] [--only NAME,...] [--device cpu] [--small]`
(`--device cpu --small`: the dry run of `bench/gpu.sh dry`, wall-clock timing; its numbers mean nothing)
"""
import argparse
import json
import statistics
import time

import torch

import kiln
from bench import gpu_workloads
from bench.gpu_workloads import PROGRAMS, TRAINING

ROWS = [  # (program, dtypes, mode): mode "reduce-overhead" for the small-batch row
    ("pointwise", ("float32", "bfloat16"), None),
    ("softmax", ("float32", "bfloat16"), None),
    ("long_softmax", ("float32",), None),
    ("layernorm", ("float32", "bfloat16"), None),
    ("attention", ("float32", "bfloat16"), None),
    ("gpt2_block", ("float32", "bfloat16"), None),
    ("hf_gpt2", ("bfloat16",), None),
    ("hf_bert", ("bfloat16",), None),
    ("small_mlp", ("float32",), "reduce-overhead"),
    ("train_step", ("float32", "bfloat16"), None),
]
DEVICE = torch.device("cuda")


def synchronize():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def elapsed_ms(fn, args, calls):
    """Milliseconds per call over `calls` calls: CUDA events on a GPU, the wall clock elsewhere."""
    if DEVICE.type != "cuda":
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        return (time.perf_counter() - start) * 1e3 / calls
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / calls


def time_calls(fn, args, repeats=5, min_seconds=0.05):
    """Median milliseconds per call."""
    for _ in range(3):
        fn(*args)
    synchronize()
    start = time.perf_counter()
    fn(*args)
    synchronize()
    once = max(time.perf_counter() - start, 1e-6)
    calls = max(1, min(200, int(min_seconds / once)))
    return statistics.median(elapsed_ms(fn, args, calls) for _ in range(repeats))


def compiled_with(compiler, fn, mode):
    if compiler == "eager":
        return fn
    if compiler == "kiln":
        kiln.reset()
        return kiln.compile(fn, mode=mode)
    torch._dynamo.reset()
    return torch.compile(fn, mode=mode)


def run_row(name, dtype_name, mode):
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    fn, args = PROGRAMS[name][0](DEVICE, dtype)
    row = {"name": name, "dtype": dtype_name, "mode": mode or "default"}
    with torch.set_grad_enabled(name in TRAINING):
        for compiler in ("eager", "kiln", "torch"):
            try:
                model = compiled_with(compiler, fn, mode)
                start = time.perf_counter()
                model(*args)
                synchronize()
                row[f"{compiler}_first_s"] = time.perf_counter() - start
                row[f"{compiler}_ms"] = time_calls(model, args)
            except Exception as e:  # a row with an error still prints
                row[f"{compiler}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return row


def describe(row):
    def ms(c):
        return f"{row[c + '_ms']:8.3f}" if c + "_ms" in row else f"{'error':>8s}"

    def ratio(a, b):
        return f"{row[b + '_ms'] / row[a + '_ms']:6.2f}x" if a + "_ms" in row and b + "_ms" in row else f"{'-':>7s}"
    compile_s = " ".join(f"{c} {row.get(c + '_first_s', float('nan')):5.1f}s" for c in ("kiln", "torch"))
    errors = "; ".join(f"{c}: {row[c + '_error']}" for c in ("eager", "kiln", "torch") if c + "_error" in row)
    return (f"{row['name']:13s} {row['dtype']:9s} {row['mode']:15s} {ms('eager')} {ms('kiln')} {ms('torch')}  "
            f"{ratio('kiln', 'eager')} {ratio('torch', 'eager')} {ratio('kiln', 'torch')}  {compile_s}  {errors}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=330.0, help="seconds; later rows are skipped")
    parser.add_argument("--json")
    parser.add_argument("--only")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="toy sizes (a dry run)")
    opts = parser.parse_args()
    global DEVICE
    DEVICE, gpu_workloads.SMALL = torch.device(opts.device), opts.small
    only = set(opts.only.split(",")) if opts.only else None
    where = torch.cuda.get_device_name() if DEVICE.type == "cuda" else f"{DEVICE} (dry run: times mean nothing)"
    print(f"{where}, torch {torch.__version__}")
    print(f"{'workload':13s} {'dtype':9s} {'mode':15s} {'eager ms':>8s} {'kiln ms':>8s} {'torch ms':>8s}  "
          f"{'kiln/e':>7s} {'torch/e':>7s} {'k vs t':>7s}  first call (compile)")
    start, rows = time.perf_counter(), []
    for name, dtypes, mode in ROWS:
        for dtype_name in dtypes:
            if only and name not in only:
                continue
            if time.perf_counter() - start > opts.budget:
                print(f"{name:13s} {dtype_name:9s} skipped: past the {opts.budget:.0f}s budget", flush=True)
                continue
            rows.append(run_row(name, dtype_name, mode))
            print(describe(rows[-1]), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
