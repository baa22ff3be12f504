"""Do kiln's Triton kernels compile for a GPU? Checked without one: every kernel a test run launches under
Triton's interpreter is compiled again by the real Triton compiler for a CUDA target (to PTX and a cubin:
no device is needed), with the argument types of its launch. The interpreter runs Python over NumPy
and accepts code the compiler refuses (types it would not promote, a libdevice call on the wrong
dtype), so this is the check that the first GPU run does not spend its minutes on compile errors.

    TRITON_INTERPRET=1 KILN_DEVICE_BACKEND=cpu:triton python -m pytest -p tests.compiler.triton_gpu_compile \
        tests/compiler/test_triton_backend.py ...

As a pytest plugin it records each launch (the kernel's module, function, argument kinds, blocks and
warps) and at the end compiles them in a fresh process (the interpreter patches triton.language in
the process it runs in): `python -m tests.compiler.triton_gpu_compile LAUNCHES.jsonl` does that part
(KILN_TRITON_LAUNCHES=path keeps the launches' file).
"""
import json
import os
import subprocess
import sys
import tempfile

TARGET = ("cuda", 90, 32)  # an H100/H200: the GPU machine's
RECORDS = []  # the launches of this test run, each distinct one once


def _kind(arg):
    """What of a launch argument decides the compiled kernel's signature."""
    import torch
    if isinstance(arg, torch.Tensor):
        return ["tensor", str(arg.dtype).removeprefix("torch."), arg.data_ptr() % 16 == 0]
    if isinstance(arg, bool):
        return ["bool", arg]
    if isinstance(arg, int):
        return ["int", arg]
    if isinstance(arg, float):
        return ["float", arg]
    return ["other", repr(arg)]


def recorder(launch, records):
    """The interpreter's launch (GridExecutor.__call__) that also appends each distinct launch to
    `records`: the kernel's module and function, its argument kinds, blocks and warps."""
    seen = {json.dumps(r, sort_keys=True) for r in records}

    def record(executor, *args, **kwargs):
        fn = executor.fn
        entry = {"path": fn.__code__.co_filename, "name": fn.__name__,
                 "args": [_kind(a) for a in args],
                 "constexprs": {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages")},
                 "num_warps": kwargs.get("num_warps", 4)}
        key = json.dumps(entry, sort_keys=True)
        if key not in seen:
            seen.add(key)
            records.append(entry)
        return launch(executor, *args, **kwargs)
    return record


def pytest_configure(config):
    from triton.runtime import interpreter
    interpreter.GridExecutor.__call__ = recorder(interpreter.GridExecutor.__call__, RECORDS)


def compile_in_a_fresh_process(records):
    """(exit status, output) of compiling `records` in a process that never ran the interpreter."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "launches.jsonl")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in records))
        done = subprocess.run([sys.executable, "-m", "tests.compiler.triton_gpu_compile", path],
                              env=dict(os.environ, TRITON_INTERPRET="0"), capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def pytest_terminal_summary(terminalreporter):
    keep = os.environ.get("KILN_TRITON_LAUNCHES")  # a file to keep the launches in (to compile them again)
    if keep:
        with open(keep, "w") as f:
            f.write("\n".join(json.dumps(r) for r in RECORDS))
    _, output = compile_in_a_fresh_process(RECORDS)
    for line in output.strip().splitlines()[-40:]:
        terminalreporter.write_line(line)


# ---- the compiling process -----------------------------------------------------------------------

def gpu_source(path):
    """The module as kiln writes it for a GPU: the interpreter's variant holds the row length as a
    constexpr (codegen/triton_kernels.finish_kernel)."""
    with open(path) as f:
        return f.read().replace("rnumel: tl.constexpr", "rnumel")


def load_gpu_module(path, folder, modules={}):
    """The GPU variant of the kernel module at `path`, written into `folder` (Triton reads a
    kernel's source from its file) and imported; once per path."""
    if path not in modules:
        import importlib.util
        copy = os.path.join(folder, os.path.basename(path))
        with open(copy, "w") as f:
            f.write(gpu_source(path))
        spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3] + "_gpu", copy)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[path] = module
    return modules[path]


def example_args(kinds):
    import torch
    out = []
    for kind, *value in kinds:
        if kind == "tensor":
            dtype, aligned = getattr(torch, value[0]), value[1]
            base = torch.empty(64, dtype=dtype)
            out.append(base if aligned else base[1:])
        else:
            out.append(value[0])
    return out


def compile_launch(record, target, folder):
    """Compile one recorded launch's kernel for `target`; the binder gives the argument types a
    launch with these arguments would have on the GPU."""
    import triton
    from triton.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature
    fn = getattr(load_gpu_module(record["path"], folder), record["name"])
    backend = triton.compiler.make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, _ = binder(*example_args(record["args"]), **record["constexprs"])
    signature = {name: spec[0] for name, spec in zip(fn.arg_names, specialization)}
    constexprs = {(i,): value for i, (value, spec) in enumerate(zip(bound.values(), specialization))
                  if spec[0] == "constexpr"}
    attrs = {(i,): backend.parse_attr(spec[1]) for i, spec in enumerate(specialization)
             if spec[0] != "constexpr" and spec[1]}
    source = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(source, target=target, options={"num_warps": record["num_warps"]})


def main(path):
    from triton.backends.compiler import GPUTarget
    target = GPUTarget(*TARGET)
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    failures = []
    with tempfile.TemporaryDirectory(prefix="kiln-gpu-compile-") as folder:
        for record in records:
            try:
                compile_launch(record, target, folder)
            except Exception as e:  # noqa: BLE001 - each failure is reported, the rest still compiled
                message = str(e).strip().splitlines()
                failures.append((record, f"{type(e).__name__}: {message[-1] if message else ''}"))
    print(f"triton gpu compile ({target.backend} sm_{target.arch}): {len(records)} launches, "
          f"{len(records) - len(failures)} compiled, {len(failures)} failed")
    for record, error in failures[:20]:
        print(f"  FAILED {os.path.basename(record['path'])}::{record['name']}: {error[:300]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
