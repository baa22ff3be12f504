"""Frames that run eagerly: what compiling their callees gains, and what it costs per call.

    python bench/skipped_frames.py [--rounds 30]

1. Eight Llama-style layers (RMSNorm, SiLU-gated MLP, tanh-GELU; d=64, 16 rows) called in a loop with a
   graph break inside it, so the model's own frame runs eagerly: eager, kiln with the skipped frame's
   callees left eager (as before eager_frames), kiln with them compiled, and torch.compile.
2. A skipped frame making 1000 calls of one kind (a builtin, a list method, a torch op, a torch Python
   function, a torch module, a user function, a user method): microseconds per call over running the
   same function uncompiled. User functions are compiled callees (an entry per call: bind, guards, run).
Timings are interleaved in one process, one thread; on a shared machine they are noisy: read ratios.
"""
import argparse
import time

import torch
from torch import nn

import kiln
from kiln.capture import eager_frames, runtime

CALLS = 1000


@kiln.disable
def note(i):
    """A call capture cannot follow: inside a loop it makes the frame run eagerly."""


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.gate, self.up, self.down = (nn.Linear(d, d, bias=False) for _ in range(3))

    def forward(self, x):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        h = nn.functional.silu(self.gate(n)) * self.up(n)
        h = 0.5 * h * (1 + torch.tanh(0.79788456 * (h + 0.044715 * h.pow(3))))
        return x + self.down(h)


class Model(nn.Module):
    def __init__(self, d=64, n=8):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            note(i)  # the break inside the loop
        return x


def _run_natively(cache, F, args, kwargs):
    return F(*args, **kwargs)


def best_seconds(cases, calls, rounds):
    """{name: best time of one call} for cases {name: (setup, fn)}, measured interleaved."""
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, (setup, fn) in cases.items():
            setup()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


def model(rounds):
    torch.manual_seed(0)
    net, x = Model().eval(), torch.randn(16, 64)
    compiled, peer = kiln.compile(net), torch.compile(net)

    def before():
        runtime.run_eagerly = _run_natively

    def after():
        runtime.run_eagerly = eager_frames.run_eagerly
    with torch.no_grad():
        expected = net(x)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
        peer(x)
        times = best_seconds({"eager": (after, lambda: net(x)), "kiln, callees eager": (before, lambda: compiled(x)),
                              "kiln, callees compiled": (after, lambda: compiled(x)),
                              "torch.compile": (after, lambda: peer(x))}, 20, rounds)
    after()
    print("8 Llama-style layers in a loop with a graph break (the model's frame runs eagerly):")
    for name, t in times.items():
        print(f"  {name:24s} {t * 1e6:9.1f} us   {times['eager'] / t:5.2f}x eager")
    print(f"  callees compiled vs eager callees: {times['kiln, callees eager'] / times['kiln, callees compiled']:.2f}x")


def helper(a):
    return a


class Thing:
    def method(self, a):
        return a


small = nn.Linear(4, 4)


KINDS = {
    "builtin len(x)": "len(x)",
    "list.append": "out.append(i)",
    "torch.relu (C)": "torch.relu(x)",
    "F.relu (torch Python)": "torch.nn.functional.relu(x)",
    "nn.Linear(4, 4)": "small(x)",
    "user function": "helper(x)",
    "user method": "thing.method(x)",
}


def _function_calling(expr):
    """`fn(x)` whose loop makes CALLS calls `expr` at one call site, with a break inside the loop."""
    src = (f"def calls(x):\n    thing, out, y = Thing(), [], None\n    for i in range(CALLS):\n"
           f"        y = {expr}\n        if i == 0:\n            note(i)\n    return y\n")
    ns = dict(globals())
    exec(compile(src, f"<bench {expr}>", "exec"), ns)
    return ns["calls"]


def overhead(rounds):
    print(f"call sites in a skipped frame, {CALLS} calls per frame (us per call):")
    x = torch.randn(4)
    for label, expr in KINDS.items():
        fn = _function_calling(expr)
        compiled = kiln.compile(fn, backend="eager")
        compiled(x)
        compiled(x)
        with torch.no_grad():
            t = best_seconds({"plain": (lambda: None, lambda: fn(x)), "skipped": (lambda: None, lambda: compiled(x))},
                             3, rounds)
        plain, skipped = t["plain"] / CALLS * 1e6, t["skipped"] / CALLS * 1e6
        print(f"  {label:22s} uncompiled {plain:7.3f}  skipped frame {skipped:7.3f}  overhead {skipped - plain:7.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model(max(3, args.rounds // 4))
    overhead(args.rounds)


if __name__ == "__main__":
    main()
