"""The compile report's data (kiln.report / KILN_REPORT) against programs whose answers we know:
break kinds and lines, failed guards with their values, kernels mapped to aten ops and user lines.
Eager is the oracle for every result."""
import inspect
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import kiln
from kiln.debug import break_kinds


def _line_of(fn, text):
    """The file line number of the first line of `fn` containing `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def breaking(x):
    y = x.sin()
    print("between graphs")
    y = y + 1
    if y.sum() > 0:
        y = y * 2
    return y.cos()


def test_break_kinds_and_lines(capsys):
    x = torch.randn(8).abs()
    expected = breaking(x)
    with kiln.report() as data:
        actual = kiln.compile(breaking)(x)
    torch.testing.assert_close(actual, expected)
    breaks = data.graph_breaks
    assert [b.kind for b in breaks] == ["print_or_log", "data_dependent"]
    assert [b.where for b in breaks] == [f"{__file__}:{_line_of(breaking, 'print(')}",
                                         f"{__file__}:{_line_of(breaking, 'if y.sum()')}"]
    assert breaks[0].line_text == 'print("between graphs")'
    for b in breaks:  # the plain words and the fix come from the registry
        assert b.explanation == break_kinds.get(b.kind).explanation and b.hint == break_kinds.get(b.kind).hint
    assert len(data.graphs) == 3 and [g.op_count for g in data.graphs][0] == 1


def test_fullgraph_error_carries_its_kind():
    def f(x):
        return x * 2 if x.sum() > 0 else x
    with pytest.raises(kiln.Unsupported) as info:
        kiln.compile(f, fullgraph=True)(torch.ones(3))
    assert info.value.kind == "data_dependent"


def test_every_kind_has_words_and_unknown_kinds_are_refused():
    for kind in break_kinds.KINDS.values():
        assert kind.explanation and kind.hint
    assert kiln.Unsupported("x", kind="print_or_log").kind == "print_or_log"
    assert kiln.Unsupported("something new").kind == "other"
    with pytest.raises(ValueError):
        kiln.Unsupported("x", kind="no_such_kind")


def scaled(x, n):
    return (x * n).relu()


def test_recompile_names_the_failed_guard_and_its_values():
    compiled = kiln.compile(scaled, dynamic=False)
    with kiln.report() as data:
        for x, n in ((torch.randn(4), 2), (torch.randn(6), 2), (torch.randn(6), 3)):
            torch.testing.assert_close(compiled(x, n), scaled(x, n))
    assert len(data.recompiles) == 2
    size_change, number_change = data.recompiles
    assert [f.source for f in size_change.failures] == ["L['x']"]
    assert size_change.failures[0].old == "size [4]" and size_change.failures[0].new == "size [6], float32"
    # the second recompile: entry 0 fails on x's size, entry 1 on n
    assert [f.source for f in number_change.failures] == ["L['x']", "L['n']"]
    assert number_change.failures[1].old == "2" and number_change.failures[1].new == "3"
    assert "scaled" in size_change.frame


def test_dynamic_dims_after_an_automatic_dynamic_recompile():
    compiled = kiln.compile(scaled)
    with kiln.report() as data:
        for x in (torch.randn(4), torch.randn(7)):
            torch.testing.assert_close(compiled(x, 2.0), scaled(x, 2.0))
    assert data.frames[0].dynamic_dims == []
    assert len(data.frames[1].dynamic_dims) == 1 and data.frames[1].dynamic_dims[0].startswith("L['x'].size()[0] = s")


def softmax_then_add(x, b):
    p = x.softmax(-1)
    return p + b


def test_kernel_to_aten_mapping_and_user_lines():
    x, b = torch.randn(16, 32), torch.randn(32)
    with kiln.report() as data:
        actual = kiln.compile(softmax_then_add)(x, b)
    torch.testing.assert_close(actual, softmax_then_add(x, b))
    kernels = data.kernels
    assert kernels, "the graph compiled to kernels"
    by_op = {op: k for k in kernels for op in k.aten_ops}
    softmax_kernel = by_op["aten.amax.default"]
    assert "softmax" in softmax_kernel.name and softmax_kernel.name.startswith("kiln_")
    assert {"aten.exp.default", "aten.sub.Tensor"} <= set(softmax_kernel.aten_ops)
    softmax_line = f"{__file__}:{_line_of(softmax_then_add, 'x.softmax')}"
    assert any(line.startswith(softmax_line) for line in softmax_kernel.user_lines)
    add_kernel = by_op["aten.add.Tensor"]
    add_line = f"{__file__}:{_line_of(softmax_then_add, 'p + b')}"
    assert any(line.startswith(add_line) for line in add_kernel.user_lines)
    # each kernel's code starts with the comment naming its aten ops
    for k in kernels:
        assert k.code.lstrip().startswith("// aten: "), k.code[:200]
    compiled = data.graphs[0].compiled[0]
    stages = compiled.stage_seconds
    assert {"aot", "lowering", "scheduling", "codegen", "build"} <= set(stages)
    assert set(data.frames[0].stage_seconds) >= {"capture", "aot", "build"}
    assert "buf" in compiled.ir_text and all(k.name in compiled.schedule_text for k in kernels)


def test_aten_nodes_keep_the_users_line():
    from kiln.compiler import aot
    seen = []

    def backend(gm, example_inputs):
        seen.append(aot.trace_aten(gm, example_inputs).gm)
        return gm.forward

    x, b = torch.randn(4, 8), torch.randn(8)
    kiln.compile(softmax_then_add, backend=backend)(x, b)
    exp = next(n for n in seen[0].graph.nodes if n.target is torch.ops.aten.exp.default)
    assert f'line {_line_of(softmax_then_add, "x.softmax")}' in exp.meta["stack_trace"]
    assert exp.meta["source_fn_stack"][-1][1] == "softmax"


def test_KILN_REPORT_writes_one_self_contained_page(tmp_path):
    program = ("import torch, kiln\n"
               "def f(x):\n"
               "    y = x.exp()\n"
               "    print('break')\n"
               "    return y + 1\n"
               "kiln.compile(f)(torch.randn(5))\n")
    env = dict(os.environ, KILN_REPORT=str(tmp_path), PYTHONPATH=str(pathlib.Path(kiln.__file__).parents[1]))
    subprocess.run([sys.executable, "-c", program], env=env, check=True, capture_output=True, timeout=300)
    pages = list(tmp_path.glob("kiln_report_*.html"))
    assert len(pages) == 1
    page = pages[0].read_text()
    assert "<script" not in page and "<link" not in page and " src=" not in page  # nothing to fetch
    assert "print_or_log" in page and "Graph breaks (1)" in page


def test_report_is_off_by_default():
    from kiln.debug import report
    assert not report.active()
    with kiln.report() as data:
        assert report.active()
    assert not report.active() and data.frames == []


def _scale(t):
    return t.tanh() * 3


def calls_a_helper(x):
    return _scale(x) + 1


def test_stack_trace_is_the_call_chain_and_the_kernel_line_the_innermost():
    x = torch.randn(16)
    with kiln.report() as data:
        torch.testing.assert_close(kiln.compile(calls_a_helper)(x), calls_a_helper(x))
    (kernel,) = data.kernels
    assert kernel.user_lines[0].startswith(f"{__file__}:{_line_of(_scale, 't.tanh()')} in _scale")
    assert "tanh" in kernel.name


def attention_over_concatenated(q, k, v):
    k2 = torch.cat([k, k * 2], dim=-2)
    return torch.nn.functional.scaled_dot_product_attention(q, k2, torch.cat([v, v], dim=-2))


def test_a_kernel_feeding_an_aten_call_names_its_own_ops_not_the_call():
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    with kiln.report() as data:
        actual = kiln.compile(attention_over_concatenated)(q, k, v)
    torch.testing.assert_close(actual, attention_over_concatenated(q, k, v))
    for kernel in data.kernels:
        assert not any("scaled_dot_product" in op for op in kernel.aten_ops), kernel
        assert "cat" in kernel.name
    (compiled,) = data.graphs[0].compiled
    assert any("scaled_dot_product" in e for e in compiled.externs)
