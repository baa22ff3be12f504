"""Compiled code lives as long as what it was compiled for, and no longer.

A long-running process (a server compiling a model per request, a notebook) compiles and drops
functions and modules all the time: each must be freed with its cache entries, and each compiled
module must have a cache of its own (not share one with every other compiled module and hit the
cache-size limit). Liveness is checked with weak references after gc.collect(), never with memory
figures, so these tests cannot flake.
"""
import gc
import warnings
import weakref

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import kiln
from kiln.capture import runtime
from tests.utils import CompileCounter

pytestmark = pytest.mark.kiln_only


def _exec(src, name, **env):
    """Functions from source of their own: a distinct code object per call, as user code made at run
    time (or a freshly imported module) has."""
    ns = dict(env, torch=torch, kiln=kiln)
    exec(compile(src, f"<test {name}>", "exec"), ns)
    return ns


def _full_collect():
    """Collect until nothing more goes: freeing one cycle can free a cache the next pass collects."""
    for _ in range(10):
        if gc.collect() == 0:
            return


def _collected(refs):
    _full_collect()
    return [r for r in refs if r() is not None]


def _compile_call_drop(make, n, backend="eager", rows=(4, 4)):
    """Make, compile, call (eager result compared) and drop `n` targets; weak references to what each
    make() said to watch. Rows that change between calls make the second compile dynamic."""
    refs = []
    for i in range(n):
        target, watched = make(i)
        refs += [weakref.ref(o) for o in watched]
        compiled = kiln.compile(target, backend=backend)
        with torch.no_grad():
            for r in rows:
                x = torch.randn(r, 8)
                torch.testing.assert_close(compiled(x), target(x))
        del target, watched, compiled
    return refs


def _plain(i):
    ns = _exec(f"def f(x):\n    return (x * 2 + {i}).relu()\n", f"plain {i}", W=torch.randn(8))
    return ns["f"], [ns["f"], ns["f"].__code__]


def _closure(i):
    ns = _exec("def make(k):\n    def f(x):\n        return x * k\n    return f\n", f"closure {i}")
    f = ns["make"](float(i))
    return f, [f, f.__code__, ns["make"]]


def _global_tensor(i):
    ns = _exec("def f(x):\n    return x + W\n", f"global {i}", W=torch.randn(8))
    return ns["f"], [ns["f"], ns["W"]]


def _graph_break(i):
    # the break calls g natively through the runtime (compiled as a frame of its own) and resumes
    ns = _exec("@kiln.disable\ndef opaque(x):\n    return x\n"
               "def g(x):\n    return x.cos()\n"
               "def f(x):\n    y = opaque(x + 1)\n    return g(y) * y\n", f"break {i}")
    return ns["f"], [ns["f"], ns["g"], ns["f"].__code__, ns["g"].__code__]


def _eager_frame(i):
    # a break inside a loop: the frame runs eagerly as rewritten code, and g still compiles
    ns = _exec("def g(x):\n    return x.cos()\n"
               "def f(x):\n    for _ in range(2):\n        print(end='')\n        x = g(x) + 1\n    return x\n",
               f"eager frame {i}")
    return ns["f"], [ns["f"], ns["g"], ns["f"].__code__, ns["g"].__code__]


def _module(i):
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    return m, [m, m[0], m[0].weight]


def _module_with_break(i):
    ns = _exec("class Net(torch.nn.Module):\n"
               "    def __init__(self):\n        super().__init__()\n        self.lin = torch.nn.Linear(8, 8)\n"
               "    def forward(self, x):\n        y = self.lin(x)\n        print(end='')\n        return y.relu()\n",
               f"module break {i}")
    m = ns["Net"]()
    return m, [m, ns["Net"], m.lin.weight]


def _bound_method(i):
    ns = _exec("class Scale:\n    def __init__(self, k):\n        self.k = k\n"
               "    def run(self, x):\n        return x * self.k\n", f"method {i}")
    obj = ns["Scale"](float(i))
    return obj.run, [obj, ns["Scale"]]


@pytest.mark.parametrize("make", [_plain, _closure, _global_tensor, _graph_break, _eager_frame, _module,
                                  _module_with_break, _bound_method], ids=lambda m: m.__name__.strip("_"))
def test_compiled_and_dropped_targets_are_freed(make):
    refs = _compile_call_drop(make, 8)
    assert _collected(refs) == []


def test_compiled_and_dropped_targets_are_freed_with_the_compiler_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    refs = _compile_call_drop(_plain, 2, backend="inductor") + _compile_call_drop(_module, 2, backend="inductor")
    assert _collected(refs) == []


def test_compiling_and_dropping_does_not_grow_kiln_state():
    """After a warm-up, compiling and dropping more functions and modules leaves no more objects of
    kiln's, tensors or runtime tables behind than before (a short version of bench/soak.py)."""
    def census():
        _full_collect()
        objs = gc.get_objects()
        return {"kiln objects": sum(1 for o in objs if _module_of(o).startswith("kiln")),
                "tensors": sum(1 for o in objs if issubclass(type(o), torch.Tensor)),
                "shape envs": sum(1 for o in objs if type(o) is ShapeEnv),
                "code caches": len(runtime._CACHES)}

    def round_(n):
        for make in (_plain, _module, _graph_break, _eager_frame):
            _compile_call_drop(make, n)
            _compile_call_drop(make, n, rows=(4, 6, 7))  # static, then dynamic compiles
    round_(3)
    before = census()
    round_(12)
    assert census() == before


def _module_of(obj):
    module = type(obj).__dict__.get("__module__")
    return module if isinstance(module, str) else ""


def test_each_compiled_module_has_its_own_cache():
    """Many compiled modules alive at once each compile once: none runs eagerly past the cache limit."""
    counter = CompileCounter()
    x = torch.randn(2, 8)
    modules = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(80)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a cache-limit warning fails the test
        compiled = [kiln.compile(m, backend=counter) for m in modules]
        with kiln.config.patch(cache_size_limit=8), torch.no_grad():
            for m, c in zip(modules, compiled):
                torch.testing.assert_close(c(x), m(x))
            for m, c in zip(modules, compiled):
                torch.testing.assert_close(c(x), m(x))
    assert counter.frame_count == len(modules)


def test_compiling_one_module_again_reuses_its_cache():
    counter = CompileCounter()
    m = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    for _ in range(3):
        torch.testing.assert_close(kiln.compile(m, backend=counter)(x), m(x))
    assert counter.frame_count == 1


def test_a_closure_made_per_call_keeps_its_cache():
    """A nested function's code object outlives each function made from it: so does its cache."""
    counter = CompileCounter()

    def step(x, k):
        def inner(y):
            return y * k + 1
        return kiln.compile(inner, backend=counter)(x)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(step(x, 2.0), x * 2.0 + 1)
    assert counter.frame_count == 1


def test_an_entry_goes_when_the_module_it_checks_dies():
    """A function compiled once and called with a new model each time (a model per request): the
    entries of dropped models go with them, so the cache never reaches its limit."""
    counter = CompileCounter()

    def run(model, x):
        return model(x) * 2
    compiled = kiln.compile(run, backend=counter)
    x = torch.randn(2, 8)
    refs = []
    with warnings.catch_warnings(), kiln.config.patch(cache_size_limit=4), torch.no_grad():
        warnings.simplefilter("error")
        for _ in range(12):
            model = torch.nn.Linear(8, 8)
            refs.append(weakref.ref(model))
            torch.testing.assert_close(compiled(model, x), model(x) * 2)
            torch.testing.assert_close(compiled(model, x), model(x) * 2)
            del model
    assert _collected(refs) == []
    assert len(compiled.__kiln_compiled__._kiln_cache.entries) <= 1
    assert counter.frame_count == 12


def test_a_replaced_global_function_is_not_matched_by_identity():
    """An entry checked `helper` by identity; once that function is gone and `helper` is None, the
    call must take the eager path (the dead reference must not read as a match)."""
    ns = _exec("def helper(x):\n    return x + 1\n"
               "def f(x):\n    return x if helper is None else helper(x)\n", "replaced global")
    f = ns["f"]
    compiled = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x + 1)
    ns["helper"] = None
    _full_collect()
    torch.testing.assert_close(compiled(x), f(x))
    torch.testing.assert_close(compiled(x), x)


def test_explain_leaves_no_cache_behind():
    """kiln.explain compiles with a private backend: its caches go once the report is made, though
    the explained function lives on."""
    def f(x):
        return x.sin() + 1
    for _ in range(3):
        kiln.explain(f)(torch.randn(3))
    _full_collect()
    assert not runtime._CACHES.get(f.__code__)
