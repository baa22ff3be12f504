"""A pytest plugin for sweeps through the Triton backend: counts the graphs compiled into Triton
kernels and those that ran through aten as a whole (with why), and prints them at the end.

    TRITON_INTERPRET=1 KILN_DEVICE_BACKEND=cpu:triton python -m pytest -p tests.compiler.triton_counts \
        tests/compiler/test_opinfo.py tests/compiler/test_fuzz_programs.py tests/models
"""
import collections

COUNTS = collections.Counter()
REASONS = collections.Counter()


def pytest_configure(config):
    import kiln.compiler as compiler
    from kiln.compiler.codegen.triton_backend import TritonBackend
    original_compile, original_log = TritonBackend.compile, compiler.log

    def compile(backend, *args, **kwargs):
        COUNTS["graphs compiled into Triton kernels"] += 1
        return original_compile(backend, *args, **kwargs)

    def log(channel, message, *args):
        if message.startswith("graph runs through aten") or "failed to build" in message or "raised" in message:
            COUNTS["graphs run through aten as a whole"] += 1
            REASONS[(message % args).split(": ", 1)[-1][:90]] += 1
        return original_log(channel, message, *args)
    TritonBackend.compile, compiler.log = compile, log


def pytest_terminal_summary(terminalreporter):
    write = terminalreporter.write_line
    write("triton sweep: " + ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items())))
    for reason, n in REASONS.most_common(15):
        write(f"  {n:5d}  {reason}")
