"""Guards and sources: the generated guard function checks what it says and hoists sources once."""
import types

import torch

from kiln.capture.guards import GuardSet
from kiln.capture.sources import AttrSource, CellSource, CodeContext, GlobalSource, ItemSource, LocalSource


class Holder:
    pass


def fn_with(globals_dict, closure=None):
    return types.SimpleNamespace(__globals__=globals_dict, __closure__=closure)


def test_source_expressions_reload_the_value():
    ctx = CodeContext()
    src = ItemSource(AttrSource(LocalSource(0, "m"), "_parameters"), "weight")
    assert src.expr(ctx) == "L[0]._parameters['weight']"
    assert GlobalSource({}, "k", root=True).expr(ctx) == "G['k']"
    cell = types.CellType(5)
    expr = CellSource("c", 0).expr(ctx)  # the frame's own free variable, through its function
    assert eval(expr, {**ctx.consts, "F": fn_with({}, (cell,))}) == 5


def test_tensor_guard_checks_dtype_shape_stride_requires_grad():
    x = torch.randn(3, 4)
    gs = GuardSet()
    gs.tensor_match(LocalSource(0, "x"), x)
    check, first_failure, _ = gs.build()
    F = fn_with({})
    assert check(F, (torch.randn(3, 4),))
    for other in (torch.randn(4, 3), torch.randn(3, 4).double(), torch.randn(4, 3).t(),
                  torch.randn(3, 4, requires_grad=True), torch.nn.Parameter(torch.randn(3, 4)), 3):
        assert not check(F, (other,)), other
    assert "L['x']" in str(first_failure(F, (torch.randn(2),)))


def test_guard_function_hoists_shared_sources_and_survives_errors():
    h = Holder()
    h.a = Holder()
    h.a.b = 2
    h.a.c = "s"
    gs = GuardSet()
    base = AttrSource(LocalSource(0, "h"), "a")
    gs.type_match(LocalSource(0, "h"), h)
    gs.const_match(AttrSource(base, "b"), 2)
    gs.const_match(AttrSource(base, "c"), "s")
    check, first_failure, src = gs.build()
    assert src.count("L[0]") == 1 and src.count(".a\n") == 1  # each source is hoisted into a local once
    F = fn_with({})
    assert check(F, (h,))
    h.a.b = 3
    assert not check(F, (h,)) and "b" in str(first_failure(F, (h,)))
    del h.a.c
    assert not check(F, (h,))  # an AttributeError inside the guard means "does not hold"


def test_global_guard_reads_the_functions_own_globals():
    gs = GuardSet()
    gs.const_match(GlobalSource(None, "scale", root=True), 2.0)
    check, _, _ = gs.build()
    assert check(fn_with({"scale": 2.0}), ())
    assert not check(fn_with({"scale": 3.0}), ())
    assert not check(fn_with({}), ())


def test_duplicate_guards_are_kept_once():
    gs = GuardSet()
    for _ in range(3):
        gs.type_match(LocalSource(0, "x"), 1)
    assert len(gs.guards) == 1
