"""The capture cache on disk: a second process that meets frames the first compiled loads their entries
and runs no capture and no compile (counted with kiln's counters and by what it imported), and gives
eager's results; a changed global, closure, default argument, inlined helper, torch version or cache
file makes it capture again instead of reusing the entry.

Each test runs a small program (PROGRAM, filled in per test) twice in fresh interpreters that share a
KILN_CACHE_DIR; the program checks every result against eager itself and prints kiln's counters.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
_MARK = "capture-cache-result "

PROGRAM = '''
import json, sys
import torch, kiln
from kiln.capture import capture_cache
from kiln.compiler import graph_cache
{prelude}
SCALE = {scale}

def helper(x, k={default}):
    return {helper_body}

def make(bias):
    def f(x, y):
        return helper(x) * SCALE + y.cos() + bias
    return f

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.eps = {eps}

    def forward(self, x):
        return {forward_body}

torch.manual_seed(0)
net = Net()
x, y = torch.randn(4, 8), torch.randn(4, 8)
f = make({bias})
compiled_f, compiled_net = kiln.compile(f, backend="{backend}"), kiln.compile(net, backend="{backend}")
if {train}:
    reference = Net()
    reference.load_state_dict(net.state_dict())
    for _ in range(2):
        compiled_net(x).sum().backward()
        reference(x).sum().backward()
    for p, q in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
else:
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled_f(x, y), f(x, y))
            torch.testing.assert_close(compiled_net(x), net(x))
print("{mark}" + json.dumps({{
    "captures": capture_cache.stats.captures, "loads": capture_cache.stats.loads,
    "stores": capture_cache.stats.stores, "stale": capture_cache.stats.stale,
    "graph_hits": graph_cache.stats.hits, "graph_misses": graph_cache.stats.misses,
    "graph_stores": graph_cache.stats.stores,
    "imported_capture": "kiln.capture.convert" in sys.modules,
    "imported_aot": "kiln.compiler.aot" in sys.modules}}))
'''

_BASE = dict(prelude="", scale="2.0", default="3", helper_body="x * k + 1", bias="0.25", backend="inductor",
             train="False", eps="0.5", forward_body="helper(torch.relu(self.lin(x))) + self.eps")


def _run(tmp_path, env_extra=None, **changes):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM.format(mark=_MARK, **{**_BASE, **changes}))
    env = {k: v for k, v in os.environ.items() if k != "KILN_CAPTURE_CACHE"}
    env.update({"PYTHONPATH": str(REPO), "KILN_CACHE_DIR": str(tmp_path / "cache"), **(env_extra or {})})
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith(_MARK))
    return json.loads(line[len(_MARK):]), done.stderr


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory):
    """The cache the unchanged program leaves (one cold run, copied into each test's own folder)."""
    folder = tmp_path_factory.mktemp("cold")
    cold, _ = _run(folder)
    assert cold["captures"] == 2 and cold["stores"] == 2 and cold["loads"] == 0, cold
    return folder / "cache"


def _cold_then(tmp_path, cold_cache, env_extra=None, **changes):
    shutil.copytree(cold_cache, tmp_path / "cache")  # (modes kept: the cache must stay private)
    return _run(tmp_path, env_extra, **changes)


def test_warm_process_captures_and_compiles_nothing(tmp_path, cold_cache):
    warm, _ = _cold_then(tmp_path, cold_cache)
    assert warm["captures"] == 0 and warm["loads"] == 2, warm
    assert warm["graph_hits"] == 2 and warm["graph_misses"] == 0, warm
    assert not warm["imported_capture"] and not warm["imported_aot"], warm


def test_eager_backend_warm_process_captures_nothing(tmp_path):
    cold, _ = _run(tmp_path, backend="eager")
    assert cold["stores"] == 2, cold
    warm, _ = _run(tmp_path, backend="eager")
    assert warm["captures"] == 0 and warm["loads"] == 2 and not warm["imported_capture"], warm


@pytest.mark.parametrize("change", [
    {"scale": "-1.5"},                        # a global the frame reads
    {"bias": "0.75"},                         # the frame's closure
    {"default": "5"},                         # the inlined helper's default argument
    {"helper_body": "x * k - 1"},             # the inlined helper's source
    {"prelude": "torch.__version__ = torch.torch_version.TorchVersion('2.99.0')"},  # torch's version
    {"eps": "0.125"},                         # an attribute of the module instance
    {"forward_body": "helper(torch.tanh(self.lin(x))) + self.eps"},  # the module class's forward
], ids=["global", "closure", "default", "helper_source", "torch_version", "module_attribute", "module_forward"])
def test_a_changed_dependency_captures_again(tmp_path, cold_cache, change):
    warm, _ = _cold_then(tmp_path, cold_cache, **change)
    assert warm["captures"] >= 1, warm  # and the program checked its results against eager


def test_off_switch(tmp_path, cold_cache):
    warm, _ = _cold_then(tmp_path, cold_cache, env_extra={"KILN_CAPTURE_CACHE": "0"})
    assert warm["captures"] == 2 and warm["loads"] == 0 and warm["stores"] == 0, warm


@pytest.mark.parametrize("damage", ["garbage", "sealed_but_stale"])
def test_a_damaged_entry_is_captured_again(tmp_path, cold_cache, damage):
    shutil.copytree(cold_cache, tmp_path / "cache")
    files = sorted((tmp_path / "cache" / "capture").rglob("*.json"))
    assert len(files) == 2
    for path in files:
        if damage == "garbage":
            path.write_bytes(b"not an entry\n{")
        else:  # a well-formed entry naming a function that is not there
            from kiln.compiler import build
            body = json.loads(path.read_bytes().partition(b"\n")[2])
            for desc in body["entry"]["guard_consts"].values():
                if desc[0] == "object" and desc[2] == "helper":
                    desc[2] = "no_such_helper"
            path.write_bytes(build.seal(body))
    warm, stderr = _run(tmp_path)
    assert warm["loads"] == 0 and warm["captures"] == 2, warm
    if damage == "garbage":
        assert "is damaged" in stderr
    else:
        assert warm["stale"] == 2, warm


def test_training_step_captures_and_compiles_nothing(tmp_path):
    """A training graph: the warm process loads the capture entry and the compiled forward and
    backward (no joint trace, partition or codegen: aot is never imported); gradients match eager."""
    cold, _ = _run(tmp_path, train="True")
    assert cold["stores"] == 1 and cold["graph_stores"] == 1, cold
    warm, _ = _run(tmp_path, train="True")
    assert warm["captures"] == 0 and warm["loads"] == 1, warm
    assert warm["graph_hits"] == 1 and warm["graph_misses"] == 0 and not warm["imported_aot"], warm


_CLOSURES = """
import functools
def make_adder(n):
    return lambda t: t + n
def twice(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args) * 2
    return wrapper
@twice
def shifted(t):
    return t - 0.5
def make_writer():
    calls = 0
    def writer(t):
        nonlocal calls
        calls = 1
        return t + calls
    return writer
adder, writer = make_adder(1.5), make_writer()
"""


def _closures_run(tmp_path, prelude=_CLOSURES):
    """Closures made at run time, as globals the frames call (inlined: their code, cells and a
    nonlocal write, which the glue replays through the function's __closure__)."""
    return _run(tmp_path, backend="eager", helper_body="writer(shifted(adder(x))) * k\n" + prelude)


@pytest.fixture(scope="module")
def closures_cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("closures")
    cold, _ = _closures_run(folder)
    assert cold["captures"] == 2 and cold["stores"] == 2, cold
    return folder / "cache"


def test_closures_made_at_run_time_are_stored_by_their_code(tmp_path, closures_cache):
    """A function a closure made is found in another process by where the program keeps it and checked
    there by its code's fingerprint; its cells by where they are (fn.__closure__[i])."""
    shutil.copytree(closures_cache, tmp_path / "cache")
    warm, _ = _closures_run(tmp_path)
    assert warm["captures"] == 0 and warm["loads"] == 2 and not warm["imported_capture"], warm


def test_a_closure_whose_code_changed_is_captured_again(tmp_path, closures_cache):
    shutil.copytree(closures_cache, tmp_path / "cache")
    again, _ = _closures_run(tmp_path, _CLOSURES.replace("t + n", "t - n"))  # the lambda's code
    assert again["captures"] == 2 and again["loads"] == 0, again


_LIBRARY_STYLE = """
import enum
import functools
class Mode(enum.Enum):
    FAST = 1
    SLOW = 2
def checked(fn):
    fn.checked = True  # an attribute of its own: no longer a plain closure, checked by identity in-process
    @functools.wraps(fn)
    def wrapper(t, mode=Mode.FAST):
        if wrapper.__code__ == WRAPPER_CODE and mode is Mode.FAST:
            return fn(t) + 1
        return fn(t)
    return wrapper
def strict(cls, check=True):
    def __strict_setattr__(self, name, value):  # made per class, as huggingface_hub's strict dataclasses
        if check and not isinstance(value, float):
            raise TypeError(name)
        object.__setattr__(self, name, value)
    cls.__setattr__ = __strict_setattr__
    return cls
@strict
class Settings:
    def __init__(self, k):
        self.k = k
@checked
def tripled(t):
    import os
    return ACT(t) * Settings(3.0).k + float(os.environ.get("KILN_TEST_SHIFT", "1"))
class Act(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = torch.nn.functional.gelu  # a C function held by an instance
    def forward(self, t):
        return self.act(t)
ACT = Act()
WRAPPER_CODE = tripled.__code__
"""


def test_decorated_functions_enum_members_and_code_objects_are_stored(tmp_path):
    """What library code is made of (transformers' models): the original function inside a decorator's
    closure, which no module holds by name, an enum member, a code object compared, a C function a
    module instance holds, os.environ, a class's own __setattr__ made by a decorator: another process
    checks them by code fingerprint, by class and name, by fingerprint, by name, where the class holds
    it, and loads the entry."""
    cold, _ = _run(tmp_path, backend="eager", helper_body="tripled(x) * k\n" + _LIBRARY_STYLE)
    assert cold["captures"] == 2 and cold["stores"] == 2, cold
    warm, _ = _run(tmp_path, backend="eager", helper_body="tripled(x) * k\n" + _LIBRARY_STYLE)
    assert warm["captures"] == 0 and warm["loads"] == 2 and not warm["imported_capture"], warm


@pytest.mark.parametrize("change", [("Settings(3.0)", "Settings(4.0)"), ("mode=Mode.FAST", "mode=Mode.SLOW"),
                                    ('"KILN_TEST_SHIFT", "1"', '"KILN_TEST_SHIFT", "2"')])
def test_a_changed_decorated_function_or_enum_default_captures_again(tmp_path, change):
    """The program checks its results against eager itself: a stale entry would fail it."""
    cold, _ = _run(tmp_path, backend="eager", helper_body="tripled(x) * k\n" + _LIBRARY_STYLE)
    assert cold["stores"] == 2, cold
    again, _ = _run(tmp_path, backend="eager", helper_body="tripled(x) * k\n" + _LIBRARY_STYLE.replace(*change))
    assert again["captures"] == 2 and again["loads"] == 0, again


def test_a_saved_cache_loads_into_an_empty_one(tmp_path, cold_cache, monkeypatch):
    """kiln.cache.save in one place, kiln.cache.load into a process with an empty cache: it runs no
    capture and no compile."""
    import kiln
    monkeypatch.setenv("KILN_CACHE_DIR", str(cold_cache))
    pack = tmp_path / "pack"
    assert kiln.cache.save(pack) >= 4  # two capture entries, two graphs, their libraries
    assert not list(pack.rglob("*.lock"))
    warm, _ = _run(tmp_path, prelude=f"print('loaded', kiln.cache.load({str(pack)!r}))")
    assert warm["captures"] == 0 and warm["loads"] == 2, warm
    assert warm["graph_hits"] == 2 and warm["graph_misses"] == 0, warm


_ZOO_PROGRAM = '''
import json, sys
import torch, kiln
from kiln.capture import capture_cache
from bench.zoo import BY_NAME, first_tensor
for name in {names!r}:
    arch = BY_NAME[name]
    model = arch.build()
    compiled = kiln.compile(model, backend="eager")
    with torch.no_grad():
        kwargs = arch.inputs(arch.lengths[0])
        torch.testing.assert_close(first_tensor(compiled(**kwargs)), first_tensor(model(**kwargs)))
print("{mark}" + json.dumps({{"captures": capture_cache.stats.captures, "loads": capture_cache.stats.loads,
                              "stores": capture_cache.stats.stores, "stale": capture_cache.stats.stale}}))
'''


def test_hugging_face_models_load_in_a_fresh_process(tmp_path):
    """Real library code (transformers' decorators, enums, config classes with their own __setattr__,
    module-held C functions, os.environ reads) stores entries another process loads: the warm process
    captures nothing. Each model's code is its own frame key, so each stores one entry."""
    pytest.importorskip("transformers")
    names = ["gpt2", "bert", "llama", "t5", "deberta_v2"]
    script = tmp_path / "zoo_program.py"
    script.write_text(_ZOO_PROGRAM.format(names=names, mark=_MARK))
    env = {k: v for k, v in os.environ.items() if k != "KILN_CAPTURE_CACHE"}
    env.update({"PYTHONPATH": str(REPO), "KILN_CACHE_DIR": str(tmp_path / "cache")})

    def run():
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith(_MARK))[len(_MARK):])

    cold = run()
    assert cold["stores"] >= len(names), cold
    warm = run()
    assert warm["captures"] == 0 and warm["loads"] == cold["stores"], warm


def test_stored_guards_keep_exactly_the_constants_their_text_names():
    """Which guard constants an entry stores is read off the guard text (one pass over its words:
    models have thousands); a name that prefixes another (C1, C10) is not taken for it."""
    from kiln.capture.capture_cache import _used
    consts = {"C1": 1, "C10": 10, "T2": int, "W3": 3}
    used = dict(_used(consts, "type(v) is T2 and v == C10 or x.C1ab"))
    assert used == {"T2": int, "C10": 10}
