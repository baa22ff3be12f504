"""Speed of real models: eager vs kiln vs torch.compile, one markdown row per model.

    python -m bench.model_speed [NAME ...] [--suite hf|vision] [--scale 2] [--length 64] [--batch 2]
                                [--threads 1] [--calls 15] [--options freezing=1]

--suite hf (default): the Hugging Face zoo (bench/zoo.py) from small random configs (hidden 64 * scale,
2 layers, `--length` tokens); --suite vision: bench/vision_models.py (`--length` is the image side,
224 unless given). Eval, fp32. Per model, in one process: compiled by kiln and by torch.compile (default
options, or freezing for both with --options freezing=1), outputs checked against eager, then calls
timed interleaved (the starting compiler rotating each round) with this thread's CPU time. Prints median
ms, speedups over eager, kiln vs torch, and the geomean over the models where every compiler ran and kiln
matched eager.
"""
import argparse
import math
import statistics
import sys
import time
import traceback

import torch

from bench.profile_model import build_model, interleaved
from bench.zoo import ARCHS, output_tensors

TOL = 1e-3


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.model_speed", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="models of the suite (default: all; the hf suite's text models)")
    p.add_argument("--suite", choices=("hf", "vision"), default="hf")
    p.add_argument("--scale", type=int, default=2, help="hf: hidden size = 64 * scale")
    p.add_argument("--length", type=int, default=None, help="tokens (hf, default 64) or image side (vision, 224)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--no-torch", action="store_true", help="leave torch.compile out")
    p.add_argument("--options", default="", help="kiln options, k=v comma-separated (e.g. freezing=1)")
    return p.parse_args(argv)


def _options(text):
    opts = {"graph_cache": False}
    for item in filter(None, text.split(",")):
        k, v = item.split("=")
        opts[k] = bool(int(v)) if v in ("0", "1") else v
    return opts


def _max_diff(actual, expected):
    a, e = output_tensors(actual), output_tensors(expected)
    if len(a) != len(e) or not a:
        return math.inf
    return max(((x - y).abs().max() / (y.abs().max() + 1)).item() for x, y in zip(a, e))


def measure(name, args):
    import kiln
    import torch._inductor.config as inductor_config
    kiln.reset()
    torch._dynamo.reset()
    options = _options(args.options)
    inductor_config.freezing = bool(options.get("freezing"))
    args.size, args.train = args.length, False
    model, (pos, kwargs) = build_model(name if args.suite == "vision" else "hf:" + name, args)
    model.eval()
    row = {"name": name}
    with torch.no_grad():
        expected = model(*pos, **kwargs)
        compiled = {}
        if not args.no_torch:  # first: torch.compile edits the model's class, which makes kiln recompile
            compiled["torch"] = torch.compile(model)
        compiled["kiln"] = kiln.compile(model, options=options)
        calls = {"eager": lambda: model(*pos, **kwargs)}
        for name, fn in compiled.items():
            begin = time.perf_counter()
            out = fn(*pos, **kwargs)
            row[name + "_compile_s"] = time.perf_counter() - begin
            row[name + "_diff"] = _max_diff(out, expected)
            calls[name] = (lambda f: lambda: f(*pos, **kwargs))(fn)
        for c in calls.values():
            c()
        samples = interleaved(calls, args.calls)
    for name, s in samples.items():
        row[name] = statistics.median(s)
    return row


def _fmt_row(r):
    e = r["eager"]
    cells = [r["name"], f"{e * 1e3:.2f}", f"{r['kiln'] * 1e3:.2f}"]
    has_torch = "torch" in r
    if has_torch:
        cells.append(f"{r['torch'] * 1e3:.2f}")
    cells.append(f"{e / r['kiln']:.2f}x")
    if has_torch:
        cells += [f"{e / r['torch']:.2f}x", f"{r['torch'] / r['kiln']:.2f}"]
    cells.append(f"{r['kiln_diff']:.1e}" + ("" if r["kiln_diff"] <= TOL else " WRONG"))
    return "| " + " | ".join(cells) + " |"


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.length is None:
        args.length = 64 if args.suite == "hf" else 224
    if args.names:
        names = args.names
    elif args.suite == "hf":
        names = [a.name for a in ARCHS if a.kind != "vision"]
    else:
        from bench.vision_models import MODELS
        names = list(MODELS)
    head = ["model", "eager ms", "kiln ms"] + ([] if args.no_torch else ["torch ms"]) + ["kiln speedup"]
    head += [] if args.no_torch else ["torch speedup", "kiln vs torch"]
    head.append("kiln max diff")
    shape = (f"hidden {64 * args.scale}, 2 layers, length {args.length}" if args.suite == "hf"
             else f"images 3x{args.length}x{args.length}")
    print(f"{args.suite}: {shape}, batch {args.batch}, {args.threads} thread(s), eval, fp32, "
          f"kiln options {_options(args.options)}")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)
    rows = []
    for name in names:
        try:
            r = measure(name, args)
        except Exception as e:  # a model that fails is a row saying so, not the end of the run
            traceback.print_exc(file=sys.stderr)
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:80]} |", flush=True)
            continue
        rows.append(r)
        print(_fmt_row(r), flush=True)
    ok = [r for r in rows if r["kiln_diff"] <= TOL]
    print(f"\ngeomean speedup over eager ({len(ok)} models): kiln {geomean([r['eager'] / r['kiln'] for r in ok]):.2f}x",
          end="")
    if not args.no_torch:
        print(f", torch.compile {geomean([r['eager'] / r['torch'] for r in ok]):.2f}x; "
              f"kiln vs torch {geomean([r['torch'] / r['kiln'] for r in ok]):.2f}", end="")
    print()


if __name__ == "__main__":
    main()
