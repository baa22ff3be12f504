"""Soak: one long-running process compiles and calls thousands of distinct functions and modules.

    python -m bench.soak [--n 10000] [--backend eager] [--every 1000]

What a server compiling per request does: every item is a new function (its own code object, from
its own `exec`) or a new module, compiled, called on a few shapes and dropped; in between, one
long-lived compiled function is called with a fresh model each time (entries must go with the
models), and one function is made to recompile on purpose past `cache_size_limit` (the one place a
cache-limit warning belongs). Each item is called on two shapes (a static compile, then a dynamic
one). Every `--every` items it prints RSS and what is alive; memory must be
flat after warm-up. Not part of the test suite (it runs for minutes); tests/capture/
test_cache_lifetime.py has the short version.
"""
import argparse
import collections
import gc
import linecache
import random
import time
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln
from bench.lifetime import rss_mb
from kiln.capture import runtime

_BODIES = [
    "return (x * {a} + {b}).relu()",
    "y = x.sin() * {a}\n    return y.sum(-1) + {b}",
    "return torch.tanh(x) @ x.t() * {a}",
    "return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + {b})",
    "y = x.cumsum(-1)\n    if y.sum() > 0:\n        return y * {a}\n    return y - {b}",
]


def make_function(rng, i):
    body = rng.choice(_BODIES).format(a=rng.randint(1, 9), b=rng.randint(1, 9))
    ns = {"torch": torch}
    exec(compile(f"def fn_{i}(x):\n    {body}\n", f"<soak fn {i}>", "exec"), ns)
    return ns[f"fn_{i}"]


def make_module(rng, i):
    width = rng.choice([4, 8, 16])
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))


def run_model(model, x):
    return model(x).softmax(-1)


def recompiles_on_purpose(x, k):
    return x * k  # k: a Python int, a constant in the graph: every new k compiles anew


def census(warned):
    for _ in range(10):  # freeing one cycle can free a cache the next pass collects
        if gc.collect() == 0:
            break
    objs = gc.get_objects()
    fx_loader = getattr(__import__("torch.fx.graph_module", fromlist=["_loader"]), "_loader", None)
    return {
        "rss_mb": round(rss_mb(), 1),
        "kiln_objects": sum(1 for o in objs if _module_of(o).startswith("kiln")),
        "tensors": sum(1 for o in objs if issubclass(type(o), torch.Tensor)),
        "code_caches": len(runtime._CACHES),
        "linecache": len(linecache.cache),
        "fx_sources": len(getattr(fx_loader, "eval_cache", {})),
        "fake_dispatch_cache": len(FakeTensorMode.cache),
        "gc_objects": len(objs),
        "limit_warnings": len(warned),
    }


def _module_of(obj):
    module = type(obj).__dict__.get("__module__")
    return module if isinstance(module, str) else ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    per_model = kiln.compile(run_model, backend=args.backend)
    on_purpose = kiln.compile(recompiles_on_purpose, backend=args.backend)
    warned = []
    other_warnings = collections.Counter()
    start = time.time()
    rows = []
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for i in range(1, args.n + 1):
            target = make_function(rng, i) if i % 2 else make_module(rng, i)
            compiled = kiln.compile(target, backend=args.backend)
            for rows_in in rng.sample([2, 3, 5, 8, 13], 2):  # shapes: static first, then dynamic
                x = torch.randn(rows_in, 8)
                torch.testing.assert_close(compiled(x), target(x), rtol=1e-4, atol=1e-4)
            del target, compiled
            x = torch.randn(4, 8)
            if i % 5 == 0:  # a request with a model of its own
                model = make_module(rng, i)
                torch.testing.assert_close(per_model(model, x), run_model(model, x))
                del model
            if i <= 100:
                on_purpose(x, i)
            others = [w for w in caught if "cache_size_limit" not in str(w.message)]
            caught[:] = warned = [w for w in caught if "cache_size_limit" in str(w.message)]
            other_warnings.update(f"{w.category.__name__}: {str(w.message)[:120]}" for w in others)
            if i % args.every == 0 or i == 1:
                row = census(warned)
                row.update(items=i, seconds=round(time.time() - start))
                rows.append(row)
                print(row, flush=True)
    names = sorted({str(w.message).split(" (")[0] for w in warned})
    print(f"cache-limit warnings: {len(warned)} ({names}); other warnings: {dict(other_warnings)}")
    base, last = rows[min(2, len(rows) - 1)], rows[-1]
    print(f"from item {base['items']} to {last['items']} ({last['seconds'] - base['seconds']} s): RSS "
          f"{base['rss_mb']} -> {last['rss_mb']} MB, kiln objects {base['kiln_objects']} -> {last['kiln_objects']}, "
          f"tensors {base['tensors']} -> {last['tensors']}, code caches {base['code_caches']} -> "
          f"{last['code_caches']}, gc objects {base['gc_objects']} -> {last['gc_objects']}")


if __name__ == "__main__":
    main()
