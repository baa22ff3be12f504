"""The capture cache for each kind of graph beyond static inference: symbolic sizes (automatic dynamic:
static at the first size, symbolic at the second), a graph break (the frame and its resume functions),
training (forward and backward), and symbolic training. One program runs them all; a second fresh
process with the same cache must run no capture and no compile for any of them (counted: kiln's
counters, what it imported, the Python code torch.fx generated), a third whose global, closure,
default argument and inlined helper's source all changed must capture every frame again, and one
whose cache files are all damaged must compile everything again. Each run checks every result,
gradient and buffer against eager itself.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
_MARK = "capture-cache-kinds "

PROGRAM = '''
import copy, json, sys
import torch, kiln
from kiln.capture import capture_cache
from kiln.compiler import graph_cache
SCALE = {scale}

generated = []  # torch.fx code generated (a graph loaded from disk and found compiled needs none)
_python_code = torch.fx.Graph.python_code
torch.fx.Graph.python_code = lambda self, *a, **k: generated.append(1) or _python_code(self, *a, **k)

def same(a, b):  # (torch.testing.assert_close imports sympy, which the warm process must not need)
    assert a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a, b)

def helper(x, k={default}):
    return {helper_body}

def make(bias):
    def dyn(x):
        return helper(x).softmax(-1) * SCALE + bias
    return dyn

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return helper(torch.tanh(self.lin(x))) * SCALE + {bias}

torch.manual_seed(0)
dyn = make({bias})
compiled_dyn = kiln.compile(dyn)
with torch.no_grad():
    for rows in (3, 5, 6):  # automatic dynamic: a static entry, then a symbolic one that serves 5 and 6
        x = torch.randn(rows, 8)
        same(compiled_dyn(x), dyn(x))

def broken(x):  # a graph break: the glue resumes in one of two resume functions, each a frame of its own
    a = helper(x) * SCALE
    if a.sum() > 0:
        b = a + {bias}
    else:
        b = a - {bias}
    return b.cos()

compiled_broken = kiln.compile(broken)
with torch.no_grad():
    for x in (torch.rand(4, 8), -torch.rand(4, 8)):
        same(compiled_broken(x), broken(x))

def train_steps(dynamic, batches):
    net = Net()
    reference = copy.deepcopy(net)
    compiled = kiln.compile(net, dynamic=dynamic)
    for rows in batches:
        x = torch.randn(rows, 8)
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
    for p, q in zip(net.parameters(), reference.parameters()):
        same(p.grad, q.grad)

train_steps(False, (4, 4))        # training, static
train_steps(True, (4, 7))         # training, symbolic
print("{mark}" + json.dumps({{
    "captures": capture_cache.stats.captures, "loads": capture_cache.stats.loads,
    "stores": capture_cache.stats.stores, "stale": capture_cache.stats.stale,
    "unportable": capture_cache.stats.unportable,
    "graph_hits": graph_cache.stats.hits, "graph_misses": graph_cache.stats.misses,
    "graph_stores": graph_cache.stats.stores, "fx_code_generated": len(generated),
    "imported": [m for m in ("kiln.capture.convert", "kiln.compiler.aot", "kiln.compiler.training", "sympy")
                 if m in sys.modules]}}))
'''

_BASE = dict(scale="2.0", default="3", helper_body="x * k + 1", bias="0.25")
# frames (one graph each): dyn at 3 rows (static), dyn symbolic, broken and its two resume functions,
# Net.forward for static training, Net.forward symbolic training
_FRAMES = 7


def _run(folder, **changes):
    script = folder / "program.py"
    script.write_text(PROGRAM.format(mark=_MARK, **{**_BASE, **changes}))
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_CAPTURE_CACHE", "KILN_LOGS")}
    env.update({"PYTHONPATH": str(REPO), "KILN_CACHE_DIR": str(folder / "cache")})
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=folder)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith(_MARK))
    return json.loads(line[len(_MARK):])


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kinds")
    counts = _run(folder)
    return folder, counts


def _copy_of(cold, tmp_path):
    shutil.copytree(cold[0] / "cache", tmp_path / "cache")
    return tmp_path


def test_cold_process_stores_every_kind(cold):
    counts = cold[1]
    assert counts["captures"] == _FRAMES and counts["stores"] == _FRAMES and counts["unportable"] == 0, counts
    assert counts["graph_stores"] == _FRAMES, counts  # five inference graphs, two training graphs


def test_warm_process_captures_and_compiles_nothing(cold, tmp_path):
    warm = _run(_copy_of(cold, tmp_path))
    assert warm["captures"] == 0 and warm["loads"] == _FRAMES, warm
    assert warm["graph_hits"] == _FRAMES and warm["graph_misses"] == 0, warm
    assert warm["imported"] == [], warm  # no interpreter, make_fx, joint trace or sympy
    assert warm["fx_code_generated"] == 0, warm  # the graphs rebuilt from disk are never run as Python


def test_changed_dependencies_capture_again(cold, tmp_path):
    changed = _run(_copy_of(cold, tmp_path), scale="-1.5", default="5", helper_body="x * k - 1", bias="0.75")
    assert changed["captures"] == _FRAMES and changed["loads"] == 0, changed


def test_damaged_files_are_compiled_again(cold, tmp_path):
    folder = _copy_of(cold, tmp_path)
    files = [p for top in ("capture", "graphs", "training") for p in (folder / "cache" / top).rglob("*.json")]
    assert len(files) == 2 * _FRAMES
    for path in files:
        path.write_bytes(path.read_bytes()[:-7])  # truncated
    damaged = _run(folder)
    assert damaged["captures"] == _FRAMES and damaged["loads"] == 0, damaged
    assert damaged["graph_hits"] == 0 and damaged["graph_misses"] == _FRAMES, damaged


def test_a_symbolic_frame_whose_compiled_graph_is_gone_is_captured_again(cold, tmp_path):
    """A symbolic graph rebuilt from disk has no fake values: compiling it would specialize it to the
    call's sizes, so without its compiled form in the cache the frame is captured again (the program
    checks the later sizes against eager); static frames load and compile their graphs."""
    folder = _copy_of(cold, tmp_path)
    for top in ("graphs", "training"):
        shutil.rmtree(folder / "cache" / top)
    counts = _run(folder)
    assert counts["captures"] == 2 and counts["stale"] == 2, counts  # dyn and the symbolic training step
    assert counts["loads"] == _FRAMES - 2 and counts["graph_hits"] == 0, counts
