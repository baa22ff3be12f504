"""Compile a small transformer-style model with kiln, check it matches eager, and time both."""
import time

import torch

import kiln


class Block(torch.nn.Module):
    def __init__(self, dim=256, hidden=256):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return torch.softmax(x + h, dim=-1) * 2.0 - 1.0


def median_time(fn, x, reps=30):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


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
        eager_t, kiln_t = median_time(model, x), median_time(compiled, x)
    print(f"compiled output matches eager: max abs diff {(out - model(x)).abs().max().item():.2e}")
    print(f"first call (compile) {first_call:.2f} s")
    print(f"eager {eager_t * 1e3:.3f} ms, kiln {kiln_t * 1e3:.3f} ms per call: {eager_t / kiln_t:.2f}x speedup")


if __name__ == "__main__":
    main()
