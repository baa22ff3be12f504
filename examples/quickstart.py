"""Compile a small transformer-style model with kiln, check it matches eager, and time both."""
import time

import torch

import kiln


class Block(torch.nn.Module):
    """Pre-norm residual MLP step with a gated output: one matmul, the rest pointwise and row reductions."""

    def __init__(self, dim=256):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.out_norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        h = x + torch.nn.functional.gelu(self.proj(self.norm(x)))
        return self.out_norm(h) * torch.sigmoid(h) + torch.softmax(h, dim=-1)


def median_times(fns, x, reps=50):
    """Median seconds per call of each fn, calls interleaved so machine noise hits them alike."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            start = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - start)
    return [sorted(ts)[len(ts) // 2] for ts in times]


def main():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4096, 256)
    compiled = kiln.compile(model)
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(x)
        first_call = time.perf_counter() - start
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
        eager_t, kiln_t = median_times([model, compiled], x)
    print(f"compiled output matches eager: max abs diff {(out - model(x)).abs().max().item():.2e}")
    print(f"first call (compile) {first_call:.2f} s")
    print(f"eager {eager_t * 1e3:.3f} ms, kiln {kiln_t * 1e3:.3f} ms per call: {eager_t / kiln_t:.2f}x speedup")


if __name__ == "__main__":
    main()
