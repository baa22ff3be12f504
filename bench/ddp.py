"""A DDP training step on 2 processes x 1 thread (gloo, 127.0.0.1): eager, kiln and torch.compile.

    python bench/ddp.py [--blocks 4] [--bucket-mb 4] [--rounds 5] [--steps 3]

The model is a stack of GPT-2-style blocks (bench/workloads.py, dim 256, batch 4 x 128 tokens); one
step is forward, MSE loss, backward (DDP all-reduces the gradients) and an SGD update. Each mode is
`DDP(model)` eager, `kiln.compile(DDP(model))` and `torch.compile(DDP(model))` (both split their
graphs at DDP's buckets), measured interleaved in rounds in the same processes, after warm-up steps
(DDP rebuilds its buckets after the first step).

Overlap: a DDP comm hook timestamps each bucket's all-reduce launch and completion. The last launch
is when the backward finished computing gradients (the last bucket is ready only then). The share of
all-reduce time hidden behind backward compute is the part of each bucket's [launch, done] interval
before that moment, over all of it; `exposed` is the time from the end of backward compute to
`backward()` returning (waiting for the all-reduces still in flight). Numbers are rank 0's medians.
On a shared machine timings are noisy: read ratios.
"""
import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from bench.workloads import GPT2Block  # noqa: E402

MODES = ("eager", "kiln", "torch.compile")


def _timed_allreduce(log, bucket):
    launched = time.perf_counter()

    def done(fut):
        log.append((launched, time.perf_counter()))
        return fut.value()
    return allreduce_hook(None, bucket).then(done)


class Mode:
    """One way of running the DDP model, with its own copy of the model and optimizer."""

    def __init__(self, name, blocks, bucket_mb):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(*(GPT2Block() for _ in range(blocks)))
        ddp = DDP(self.model, bucket_cap_mb=bucket_mb)
        self.log = []
        ddp.register_comm_hook(self.log, _timed_allreduce)
        self.run = {"eager": ddp, "kiln": kiln.compile(ddp) if name == "kiln" else None,
                    "torch.compile": torch.compile(ddp) if name == "torch.compile" else None}[name]
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.step_times, self.hidden, self.exposed, self.buckets = [], [], [], 0

    def step(self, x, target, record=True):
        self.log.clear()
        start = time.perf_counter()
        loss = F.mse_loss(self.run(x), target)
        loss.backward()
        backward_done = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad()
        end = time.perf_counter()
        if record:
            self.step_times.append(end - start)
            compute_end = max(launch for launch, _ in self.log)
            total = sum(done - launch for launch, done in self.log)
            hidden = sum(max(0.0, min(done, compute_end) - launch) for launch, done in self.log)
            self.hidden.append(hidden / total if total else 0.0)
            self.exposed.append(backward_done - compute_end)
            self.buckets = len(self.log)
        return loss.detach()


def _worker(rank, world, port, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    g = torch.Generator().manual_seed(rank)
    x, target = torch.randn(4, 128, 256, generator=g), torch.randn(4, 128, 256, generator=g)
    modes = {name: Mode(name, args.blocks, args.bucket_mb) for name in args.modes}
    losses = {}
    for name, mode in modes.items():  # warm-up: compiles, and DDP rebuilds its buckets after step 1
        compile_start = time.perf_counter()
        mode.step(x, target, record=False)
        mode.compile_s = time.perf_counter() - compile_start
        for _ in range(2):
            losses[name] = mode.step(x, target, record=False)
    for _ in range(args.rounds):
        for mode in modes.values():
            for _ in range(args.steps):
                mode.step(x, target)
    if rank == 0:
        out.update({name: {"step_ms": 1e3 * statistics.median(m.step_times), "hidden": statistics.median(m.hidden),
                           "exposed_ms": 1e3 * statistics.median(m.exposed), "buckets": m.buckets,
                           "first_step_s": m.compile_s, "loss": float(losses[name])} for name, m in modes.items()})
    dist.destroy_process_group()


def _run(rank, world, port, args, queue):
    out = {}
    _worker(rank, world, port, args, out)
    if rank == 0:
        queue.put(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_run, args=(2, port, args, queue), nprocs=2, start_method="spawn")
    results = queue.get()
    params = sum(p.numel() for p in torch.nn.Sequential(*(GPT2Block() for _ in range(args.blocks))).parameters())
    print(f"DDP step, 2 processes x 1 thread, {args.blocks} GPT-2 blocks ({params / 1e6:.1f}M params, "
          f"{4 * params / 2**20:.1f} MiB of gradients), bucket_cap_mb={args.bucket_mb}, batch 4x128x256")
    print(f"{'mode':<14} {'step ms':>8} {'vs eager':>8} {'buckets':>7} {'hidden':>7} {'exposed ms':>10} "
          f"{'1st step s':>10} {'loss':>10}")
    eager = results.get("eager", {}).get("step_ms")
    for name, r in results.items():
        ratio = f"{eager / r['step_ms']:.2f}x" if eager else "-"
        print(f"{name:<14} {r['step_ms']:8.1f} {ratio:>8} {r['buckets']:7d} {r['hidden']:7.0%} "
              f"{r['exposed_ms']:10.1f} {r['first_step_s']:10.1f} {r['loss']:10.6f}")


if __name__ == "__main__":
    main()
