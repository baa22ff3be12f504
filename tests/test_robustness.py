"""kiln under faults and bad input: Ctrl-C in the middle of a compile, wrong option values."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from tests.utils import CompileCounter

# A fresh process (the lazy imports must not have happened yet) whose first compile gets SIGINT while
# torch or kiln is importing a module `{start}...`, once `{after}` has finished importing: deterministic,
# unlike a timer. The interrupt must reach the caller, and later compiles (a training step, which
# reads torch._dynamo.utils) must work and match eager.
_INTERRUPTED_CHILD = textwrap.dedent("""
    import importlib.abc, os, signal, sys
    # Python's own Ctrl-C handler, whatever the parent left: a process that ignores SIGINT (SIG_IGN is
    # inherited across exec) would never see the interrupt this test sends itself
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import torch, kiln

    def finished(name):  # a submodule is bound to its package once its import has finished
        package, _, child = name.rpartition(".")
        return hasattr(sys.modules.get(package), child)

    class CtrlC(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.startswith({start!r}) and finished({after!r}):
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)  # delivered in the middle of this import
            return None

    x = torch.randn(8, 8)
    sys.meta_path.insert(0, CtrlC())
    try:
        kiln.compile(lambda x: (x * 2).sin().sum(0))(x)
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted")
    # no module left half imported: every submodule loaded is bound to its package
    print("orphans", sorted(m for m in sys.modules if m.startswith({start!r}) and not finished(m)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    reference = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    compiled(x).sum().backward()
    reference(x).sum().backward()
    torch.testing.assert_close(model[0].weight.grad, reference[0].weight.grad)
    f = lambda x: (x * 2).sin().sum(0)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))
    print("later compiles ok")
""")


def test_an_interrupt_during_the_first_compile_leaves_kiln_usable(tmp_path):
    """torch imports the torch._dynamo package from inside FakeTensorMode, on kiln's first compile;
    Ctrl-C there used to leave its finished submodules orphaned, and later compiles failed with
    `module 'torch._dynamo' has no attribute 'utils'`."""
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(pathlib.Path(__file__).parents[1])}
    code = _INTERRUPTED_CHILD.format(start="torch._dynamo.", after="torch._dynamo.utils")
    # on a loaded machine the child was seen not to reach the interrupting import now and then (cause
    # not found: it passes alone): up to three children, each must stay usable, one must be interrupted
    firsts = []
    for attempt in range(3):
        env["KILN_CACHE_DIR"] = str(tmp_path / str(attempt))  # a warm cache would skip the first compile
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.split("\n")
        assert lines[1:3] == ["orphans []", "later compiles ok"], done.stdout
        firsts.append(lines[0])
        if lines[0] == "interrupted":
            break
    assert "interrupted" in firsts, firsts


def test_an_interrupt_in_the_backend_leaves_no_entry_behind():
    """A compile cut short (Ctrl-C inside the backend) commits nothing: the next call compiles anew."""
    counter = CompileCounter()
    calls = []

    def backend(gm, example_inputs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return counter(gm, example_inputs)

    def f(x):
        return x.cos() + 1
    compiled = kiln.compile(f, backend=backend)
    x = torch.randn(4)
    with pytest.raises(KeyboardInterrupt):
        compiled(x)
    assert compiled.__kiln_compiled__._kiln_cache.entries == []
    torch.testing.assert_close(compiled(x), f(x))
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 1


@pytest.mark.parametrize("options, match", [
    ({"max_autotune": "yes"}, r"'max_autotune' must be True or False, got 'yes'"),
    ({"epilogue_fusion": 1}, r"'epilogue_fusion' must be True or False, got 1"),
    ({"cpp.threads": "four"}, r"'cpp.threads' must be an int >= 1 or -1, got 'four'"),
    ({"cpp.threads": 0}, r"'cpp.threads' must be an int >= 1 or -1, got 0"),
    ({"cpp.threads": 2.0}, r"'cpp.threads' must be an int"),
    ({"cpp.min_parallel_work": -5}, r"'cpp.min_parallel_work' must be an int >= 0"),
    ({"cpp.simdlen": True}, r"'cpp.simdlen' must be an int >= 1 or None"),
    ({"trace.debug_dir": 3}, r"'trace.debug_dir' must be a path"),
    ({1: True}, r"unknown option"),
])
def test_option_values_are_checked_where_they_are_given(options, match):
    with pytest.raises(kiln.InvalidArgument, match=match):
        kiln.compile(lambda x: x + 1, options=options)


@pytest.mark.parametrize("options", [
    {"max_autotune": False}, {"cpp.threads": -1}, {"cpp.threads": 1}, {"cpp.simdlen": None},
    {"cpp.simdlen": 256}, {"trace.debug_dir": pathlib.Path("somewhere")}, {"cpp.min_parallel_work": 0},
])
def test_good_option_values_are_accepted(options):
    compiled = kiln.compile(lambda x: x + 1, backend="eager", options=options)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x + 1)


def test_every_option_default_is_a_value_it_accepts():
    from kiln.config import COMPILER_OPTIONS, MODE_OPTIONS
    for table in (COMPILER_OPTIONS, kiln.config._settings):
        for name, option in table.items():
            assert option.accepts(option.default), name
    for mode, settings in MODE_OPTIONS.items():
        for name, value in settings.items():
            assert COMPILER_OPTIONS[name].accepts(value), (mode, name)


def test_config_settings_are_checked_and_a_bad_patch_changes_nothing():
    with pytest.raises(kiln.InvalidArgument, match="'cache_size_limit' must be an int >= 0, got 'many'"):
        kiln.config.cache_size_limit = "many"
    with pytest.raises(kiln.InvalidArgument, match="'verbose' must be True or False"):
        kiln.config.patch(cache_size_limit=3, verbose="loud")
    assert kiln.config.cache_size_limit == 64 and kiln.config.verbose is False
