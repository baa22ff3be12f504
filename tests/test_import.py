"""`import kiln` loads only the runtime: sympy, torch's symbolic shapes, kiln's
interpreter and compiler load with the first compile, and a call that hits the cache imports nothing.
Each check runs in a fresh interpreter (this one has imported everything long ago)."""
import os
import subprocess
import sys

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
_HEAVY = ["sympy", "torch.fx.experimental.symbolic_shapes",
          "kiln.capture.convert", "kiln.capture.interpreter", "kiln.compiler"]


def _run(code):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_kiln_loads_no_compiler():
    out = _run("import sys, torch, kiln\n"
               f"print([m for m in {_HEAVY!r} if m in sys.modules])")
    assert out.strip() == "[]"


def test_compile_loads_capture_and_a_hit_imports_nothing():
    out = _run("import sys, torch, kiln\n"
               "f = kiln.compile(lambda x: x * 2 + 1, backend='eager')\n"
               "x = torch.ones(3)\n"
               "assert torch.equal(f(x), x * 2 + 1)\n"
               "before = set(sys.modules)\n"
               "assert torch.equal(f(x), x * 2 + 1)\n"
               "print(sorted(set(sys.modules) - before), 'kiln.capture.convert' in sys.modules)")
    assert out.strip() == "[] True"
