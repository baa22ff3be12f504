"""Profiler blocks inside a compiled frame keep profiling (torch.compile drops them): the graph stays
whole, and the profiler records the graph calls the block spans, its labels included."""
import torch

import kiln
from tests.utils import CompileCounter


def _names(prof):
    events = prof.events() if isinstance(prof, torch.profiler.profile) else prof.function_events
    return {e.name for e in events}


def labelled_with_a_break(x):
    y = x * 2
    with torch.profiler.profile() as prof:
        y = y + 1
        with torch.profiler.record_function("kiln_test_label"):
            z = y.sin()
            z.tolist()  # a graph break inside both blocks
            z = z.cos()
    return z, prof


def test_a_break_inside_profiler_blocks_keeps_two_graphs_and_the_profile():
    x = torch.randn(3)
    counter = CompileCounter()
    z, prof = kiln.compile(labelled_with_a_break, backend=counter)(x)
    want, want_prof = labelled_with_a_break(x)
    torch.testing.assert_close(z, want)
    assert counter.frame_count == 2  # the graph before the break and the one after (as torch.compile)
    assert type(prof) is torch.profiler.profile
    assert {"kiln_test_label", "aten::sin", "aten::cos"} <= _names(prof)
    assert not torch.autograd._profiler_enabled()  # both blocks left


def test_an_autograd_profiler_block_without_a_break_is_one_graph():
    def f(x):
        with torch.autograd.profiler.profile() as prof:
            with torch.autograd.profiler.record_function("kiln_inner"):
                y = x.exp() * 3
        return y, prof
    x = torch.randn(3)
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    for _ in range(2):  # a new profile per call, one entry for both
        y, prof = compiled(x)
        torch.testing.assert_close(y, f(x)[0])
        assert {"kiln_inner", "aten::exp"} <= _names(prof)
    assert counter.frame_count == 1 and counter.op_count == 2
    assert not torch.autograd._profiler_enabled()


def test_a_label_outside_any_profiler_changes_nothing():
    def f(x):
        with torch.profiler.record_function("unrecorded"):
            return x.relu() + 1
    x = torch.randn(4)
    counter = CompileCounter()
    torch.testing.assert_close(kiln.compile(f, backend=counter, fullgraph=True)(x), f(x))
    assert counter.frame_count == 1 and counter.op_count == 2
