"""kiln on CUDA against eager: each program of bench/gpu_workloads in float32 and bfloat16, and with
dynamic sizes, a training step and a mixed-device graph. Prints one line per case (OK / MISMATCH /
ERROR, and how many of its graphs ran as Triton kernels) and exits 1 if any case is wrong.

`python -m bench.gpu_check [--device cpu] [--small] [NAME ...]` (bench/gpu.sh runs it on the GPU machine;
`bench/gpu.sh dry` runs it on CPU tensors through Triton's interpreter, at toy sizes).
"""
import argparse
import sys
import time
import traceback

import torch

import kiln
from bench import gpu_workloads
from bench.gpu_workloads import PROGRAMS, TRAINING

TOLERANCE = {torch.float32: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}
DEVICE = torch.device("cuda")


class GraphCounter:
    """Counts compiled graphs that ran as Triton kernels and those that ran through aten as a whole."""

    def __enter__(self):
        import kiln.compiler as compiler
        from kiln.compiler.codegen.triton_backend import TritonBackend
        self.triton = self.aten = 0
        self._compile, self._aten = TritonBackend.compile, compiler._run_through_aten
        counter = self

        def compile(backend, *args, **kwargs):
            counter.triton += 1
            return counter._compile(backend, *args, **kwargs)

        def aten(gm):
            counter.aten += 1
            return counter._aten(gm)
        TritonBackend.compile, compiler._run_through_aten = compile, aten
        return self

    def __exit__(self, *exc):
        import kiln.compiler as compiler
        from kiln.compiler.codegen.triton_backend import TritonBackend
        TritonBackend.compile, compiler._run_through_aten = self._compile, self._aten


def compare(got, expected, dtype):
    got, expected = (x if isinstance(x, (tuple, list)) else (x,) for x in (got, expected))
    for g, e in zip(got, expected):
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g.float(), e.float(), equal_nan=True, **TOLERANCE[dtype])
        else:
            torch.testing.assert_close(g, e)


def check_program(name, dtype, dynamic=False, mode=None):
    torch.manual_seed(0)
    fn, args = PROGRAMS[name][0](DEVICE, dtype)
    with torch.set_grad_enabled(name in TRAINING):
        expected = fn(*args)
        kiln.reset()
        compiled = kiln.compile(fn, dynamic=dynamic, mode=mode)
        got = compiled(*args)
        got = compiled(*args)  # a second call: the cached entry
    compare(got, expected, dtype)


def check_dynamic():
    fn = lambda x: torch.softmax(x * 2, -1).sum(0) + x.mean()  # noqa: E731
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for rows, cols in ((3, 40), (17, 777), (64, 5000)):
        x = torch.randn(rows, cols, device=DEVICE)
        compare(compiled(x), fn(x), torch.float32)


def check_training(mode=None):
    from bench.gpu_workloads import GPT2Block
    torch.manual_seed(0)
    eager_model = GPT2Block(256, 4).to(DEVICE)
    kiln_model = GPT2Block(256, 4).to(DEVICE)
    kiln_model.load_state_dict(eager_model.state_dict())
    x = torch.randn(4, 64, 256, device=DEVICE)

    def step(model):
        loss = model(x).square().mean()
        loss.backward()
        return loss
    kiln.reset()
    compiled = kiln.compile(step, mode=mode)
    for _ in range(3):  # reduce-overhead: warm-up, record, replay
        compare(compiled(kiln_model), step(eager_model), torch.float32)
        for a, b in zip(kiln_model.parameters(), eager_model.parameters()):
            compare(a.grad, b.grad, torch.float32)


def check_mixed_devices():
    def fn(x, scale):
        return (x * scale).relu().to("cpu") + 1, (x.sum() * scale).to(DEVICE)
    x, scale = torch.randn(64, 64, device=DEVICE), torch.tensor(3.0)
    kiln.reset()
    compare(kiln.compile(fn)(x, scale), fn(x, scale), torch.float32)


def cases(names):
    for name in names:
        for dtype in (torch.float32, torch.bfloat16):
            yield f"{name}[{str(dtype)[6:]}]", lambda name=name, dtype=dtype: check_program(name, dtype)
    # launches tuned (max_autotune's candidates, then coordinate descent), then replayed as CUDA graphs
    yield "softmax_max_autotune", lambda: check_program("softmax", torch.float32, mode="max-autotune")
    yield "dynamic_sizes", check_dynamic
    yield "training_step", check_training
    yield "training_step_cudagraphs", lambda: check_training("reduce-overhead")
    yield "mixed_devices", check_mixed_devices


def main(argv):
    global DEVICE
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="toy sizes (a dry run)")
    parser.add_argument("names", nargs="*")
    opts = parser.parse_args(argv)
    DEVICE, gpu_workloads.SMALL = torch.device(opts.device), opts.small
    names = opts.names or list(PROGRAMS)
    failures = 0
    for label, run in cases(names):
        start = time.perf_counter()
        with GraphCounter() as graphs:
            try:
                run()
                verdict = "OK"
            except AssertionError as e:
                verdict, failures = f"MISMATCH {str(e).splitlines()[0]}", failures + 1
            except Exception as e:
                verdict, failures = f"ERROR {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", failures + 1
                traceback.print_exc(limit=-3)
        print(f"{label:28s} {verdict:10s} triton graphs {graphs.triton}, whole-graph aten {graphs.aten}, "
              f"{time.perf_counter() - start:.1f}s", flush=True)
    print(f"gpu check: {failures} failing", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
