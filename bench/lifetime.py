"""Memory after compiling and dropping many functions and modules: kiln vs torch.compile.

    python -m bench.lifetime [--n 1000] [--backend eager] [--compilers kiln,torch]

Each (compiler, kind) runs in a fresh process: it compiles, calls and drops `--n` functions (each
its own code object, from its own `exec`) or `--n` modules (a Linear+ReLU each), collects garbage
and reports, after a warm-up, half-way and at the end, the resident set size and what is still
alive: the user's functions, code objects and modules (weak references to each), tensors, and the
compiler's own gc-tracked objects (types from the compiler's package). A compiler that frees what it
compiled keeps these flat.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import weakref

_MARK = "lifetime-result "
_OWN_PACKAGES = {"kiln": ("kiln",), "torch": ("torch._dynamo", "torch._inductor")}


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_function(i):
    """A fresh function with its own code object (its own source text and file name)."""
    ns = {}
    src = f"def fn_{i}(x):\n    return (x * 2 + 1).relu()\n"
    exec(compile(src, f"<lifetime fn {i}>", "exec"), ns)
    return ns[f"fn_{i}"]


def make_module(i):
    import torch
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())


def compiler_for(name, backend):
    if name == "kiln":
        import kiln
        return lambda fn: kiln.compile(fn, backend=backend)
    import torch
    return lambda fn: torch.compile(fn, backend=backend)


def _module_of(obj):
    module = type(obj).__dict__.get("__module__")
    return module if isinstance(module, str) else ""


def live_counts(compiler_name, refs):
    import torch
    for _ in range(10):  # freeing one cycle can free more that the next pass collects
        if gc.collect() == 0:
            break
    objs = gc.get_objects()
    own = _OWN_PACKAGES[compiler_name]
    return {
        "rss_mb": round(rss_mb(), 1),
        "alive_user_objects": sum(r() is not None for r in refs),
        "tensors": sum(1 for o in objs if issubclass(type(o), torch.Tensor)),
        "compiler_objects": sum(1 for o in objs if _module_of(o).startswith(own)),
        "gc_objects": len(objs),
    }


def child(compiler_name, kind, n, backend, warmup):
    import torch
    torch.set_num_threads(1)
    compile_fn = compiler_for(compiler_name, backend)
    make = make_function if kind == "functions" else make_module
    x = torch.randn(4, 8)
    refs = []

    def one(i):
        user = make(i)
        refs.append(weakref.ref(user))
        if kind == "functions":
            refs.append(weakref.ref(user.__code__))
        compiled = compile_fn(user)
        with torch.no_grad():
            compiled(x)
            compiled(x)

    for i in range(warmup):
        one(i)
    before = live_counts(compiler_name, refs)
    for i in range(warmup, warmup + n // 2):
        one(i)
    middle = live_counts(compiler_name, refs)
    for i in range(warmup + n // 2, warmup + n):
        one(i)
    after = live_counts(compiler_name, refs)
    print(_MARK + json.dumps({"before": before, "middle": middle, "after": after}), flush=True)


def run(compiler_name, kind, n, backend, warmup):
    command = [sys.executable, "-m", "bench.lifetime", "--child", compiler_name, kind, str(n), backend, str(warmup)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    found = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if not found:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(found[-1][len(_MARK):])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--compilers", default="kiln,torch")
    parser.add_argument("--kinds", default="functions,modules")
    parser.add_argument("--child", nargs=5)
    args = parser.parse_args()
    if args.child:
        compiler_name, kind, n, backend, warmup = args.child
        return child(compiler_name, kind, int(n), backend, int(warmup))
    print(f"compile, call twice and drop {args.n} of each kind (backend {args.backend!r}, after {args.warmup} "
          f"warm-up ones); counts after gc.collect()")
    for kind in args.kinds.split(","):
        for compiler_name in args.compilers.split(","):
            result = run(compiler_name, kind, args.n, args.backend, args.warmup)
            if "error" in result:
                print(f"{kind:9} {compiler_name:5}: failed: {result['error']}")
                continue
            b, m, a = result["before"], result["middle"], result["after"]
            print(f"{kind:9} {compiler_name:5}: RSS {b['rss_mb']:.1f} -> {m['rss_mb']:.1f} -> {a['rss_mb']:.1f} MB "
                  f"(second half +{(a['rss_mb'] - m['rss_mb']) * 1024 / (args.n - args.n // 2):.1f} KB each); "
                  + "; ".join(f"{name} {b[key]} -> {m[key]} -> {a[key]}" for name, key in (
                      ("alive of the user's objects", "alive_user_objects"), ("tensors", "tensors"),
                      ("compiler objects", "compiler_objects"), ("gc objects", "gc_objects"))))


if __name__ == "__main__":
    main()
