"""KILN_LOGS: graph_breaks and recompiles artifacts report what happened, with the user's file:line."""
import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln

pytestmark = pytest.mark.kiln_only
THIS_FILE = os.path.basename(__file__)
SCALE = 1.0


def breaks_once(x):
    y = x + 1
    print("log me")  # BREAK
    return y * 2


def uses_scale(x):
    return x * SCALE


def marked_line(fn):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if "# BREAK" in line)


def test_graph_break_logged_with_file_and_line(kiln_logs, caplog, capsys):
    kiln_logs("graph_breaks,recompiles")
    with caplog.at_level("DEBUG", logger="kiln"):
        kiln.compile(breaks_once, backend="eager")(torch.randn(3))
    assert f"{THIS_FILE}:{marked_line(breaks_once)}" in caplog.text
    assert "print" in caplog.text


def test_recompile_logged_with_reason(kiln_logs, caplog, monkeypatch):
    kiln_logs("recompiles")
    compiled = kiln.compile(uses_scale, backend="eager")
    with caplog.at_level("DEBUG", logger="kiln"):
        compiled(torch.randn(3))
        assert "uses_scale" not in caplog.text
        monkeypatch.setattr(sys.modules[__name__], "SCALE", 4.0)
        compiled(torch.randn(3))
    assert "uses_scale" in caplog.text and "SCALE" in caplog.text


def test_logs_off_says_nothing(kiln_logs, caplog):
    kiln_logs("")
    with caplog.at_level("DEBUG", logger="kiln"):
        kiln.compile(breaks_once, backend="eager")(torch.randn(3))
    assert "log me" not in caplog.text and THIS_FILE not in caplog.text


def test_kiln_logs_environment_variable_writes_to_stderr(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import torch, kiln
        def f(x):
            y = x + 1
            print("mid")
            return y
        kiln.compile(f, backend="eager")(torch.randn(2))
    """))
    env = dict(os.environ, KILN_LOGS="graph_breaks")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "graph_breaks" in done.stderr and "prog.py:5" in done.stderr


def test_eager_fallback_for_generator_logs_reason(kiln_logs, caplog):
    def gen(x):
        yield x + 1

    kiln_logs("graph_breaks")
    with caplog.at_level("DEBUG", logger="kiln"):
        out = list(kiln.compile(gen, backend="eager")(torch.ones(2)))
    torch.testing.assert_close(out[0], torch.full((2,), 2.0))
    assert "generator" in caplog.text and "gen" in caplog.text


def test_guards_artifact_lists_guards_on_the_input(kiln_logs, caplog):
    kiln_logs("guards")
    with caplog.at_level("DEBUG", logger="kiln"):
        kiln.compile(uses_scale, backend="eager")(torch.randn(3))
    assert "x" in caplog.text and "SCALE" in caplog.text


def test_graph_artifact_shows_the_ops(kiln_logs, caplog):
    def sin_then_cos(x):
        return torch.cos(torch.sin(x))
    kiln_logs("graph")
    with caplog.at_level("DEBUG", logger="kiln"):
        kiln.compile(sin_then_cos, backend="eager")(torch.randn(3))
    assert "sin" in caplog.text and "cos" in caplog.text
