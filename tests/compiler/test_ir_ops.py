"""The IR's op table (kiln/compiler/ir_ops.py): every codegen prints every op, the verifier accepts
what lowering makes and rejects a corrupted IR; the IR printer names shared subexpressions once;
trace.enabled / trace.graph_diagram write what they promise."""
import shutil

import pytest
import sympy
import torch

import kiln

from kiln.compiler import aot, ir, ir_ops
from kiln.compiler.codegen.cpp_exprs import BINARY_CALLS, BINARY_OPS, UNARY_CALLS, ExprPrinter, compute_ctype
from kiln.compiler.codegen.cpp_prelude import VECTOR_LIBM, VECTOR_LIBM_BINARY
from kiln.compiler.ir_printer import print_ir
from kiln.compiler.lower import GraphLowering
from kiln.compiler.schedule import Kernel, build_program
from kiln.config import compiler_options
from tests.compiler.test_compile_fx import check, compiled


def _operands(spec, dtype):
    """Operands that satisfy `spec`'s rule, for a result of `dtype`."""
    x = ir.load("buf0", sympy.Integer(0), dtype)
    if spec.rule == "where":
        return (ir.load("buf1", sympy.Integer(0), torch.bool), x, x)
    if spec.rule == "float_test":
        return (ir.load("buf1", sympy.Integer(0), torch.float32),)
    return (x,) * spec.arity


def _result_dtype(spec):
    if spec.rule in ("compare", "bool", "float_test"):
        return torch.bool
    return torch.int64 if spec.rule == "integer" else torch.float32


OPERATORS = [name for name, spec in ir_ops.OPS.items() if spec.rule not in ("leaf", "load", "check_index")]


@pytest.mark.parametrize("op", OPERATORS)
def test_cpp_codegen_prints_every_op(op):
    spec = ir_ops.OPS[op]
    dtype = _result_dtype(spec)
    e = ir.Expr(op, _operands(spec, dtype), dtype if op != "round_to" else torch.bfloat16)
    assert ir_ops.check_expr(e) is None
    args = [f"a{i}" for i in range(spec.arity)]
    code = ExprPrinter.op_code(e, args, compute_ctype(e.dtype))
    assert all(a in code for a in args), code


def test_table_holds_every_op_the_cpp_codegen_knows():
    known = set(BINARY_OPS) | set(BINARY_CALLS) | set(UNARY_CALLS) | set(VECTOR_LIBM) | set(VECTOR_LIBM_BINARY)
    assert known <= set(ir_ops.OPS), known - set(ir_ops.OPS)


def _program(fn, *args):
    gm = torch.fx.symbolic_trace(fn)
    aten = aot.trace_aten(gm, list(args))
    with ir.indirect_scope():
        graph = GraphLowering(aten.gm, list(args), compiler_options()).run()
        return graph, build_program(graph, compiler_options())


def _fn(x, y):
    e = (x * 2).exp()
    return (e * e + e).sum(-1), (x > y).float() * y


def test_verifier_accepts_lowered_ir_and_rejects_corrupted_ir():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    _, program = _program(_fn, x, y)
    ir_ops.verify(program)  # what lowering makes passes
    node = next(n for k in program.steps if isinstance(k, Kernel) for n in k.nodes)
    good = node.body
    int_value = ir.const(1, torch.int64)
    corruptions = [
        ir.Expr("add", (good, int_value), good.dtype),            # operand dtypes differ
        ir.Expr("exp", (good, good), good.dtype),                  # wrong arity
        ir.Expr("no_such_op", (good,), good.dtype),                # unknown op
        ir.Expr("lt", (good, good), good.dtype),                   # a comparison that is not bool
        ir.Expr("where", (good, good, good), good.dtype),          # a float condition
    ]
    for bad in corruptions:
        node.body = bad
        with pytest.raises(ir_ops.IRVerifyError, match=node.name):
            ir_ops.verify(program)
    node.body = good
    ir_ops.verify(program)


def test_debug_option_verifies_and_results_match_eager():
    check(_fn, torch.randn(4, 8), torch.randn(4, 8), debug=True)


def test_ir_printer_names_a_shared_subexpression_once_and_cuts_nothing():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    graph, program = _program(_fn, x, y)
    text = print_ir(program, graph.origins)
    # the sum reads e = exp(x * 2) three times (e * e + e): one temporary, defined once, used thrice
    total = next(n.name for k in program.steps if isinstance(k, Kernel) for n in k.nodes if n.is_reduction)
    section = text.split(f"\n{total}: ", 1)[1].split("\n\n", 1)[0]
    (definition,) = [line for line in section.splitlines() if line.strip().startswith("t") and " = " in line]
    name = definition.split(":")[0].strip()
    assert section.count(f"{name}:") == 1
    assert f"sum-reduce (({name} * {name}) + {name})" in section, text
    assert "# from aten.exp.default" in text
    assert "..." not in text


def test_trace_writes_every_stage_and_diagrams(tmp_path):
    def f(x):
        return torch.softmax(x, -1) + 1
    x = torch.randn(8, 8)
    c = kiln.compile(f, options={"trace.enabled": True, "trace.graph_diagram": True, "trace.debug_dir": str(tmp_path)})
    torch.testing.assert_close(c(x), f(x))
    (folder,) = tmp_path.iterdir()
    names = {p.name for p in folder.iterdir()}
    assert {"fx_graph.txt", "aten_graph.txt", "ir.txt", "schedule.txt", "kernels.cpp", "wrapper.py"} <= names
    assert "kiln_fused_softmax_add_0" in (folder / "schedule.txt").read_text()
    assert "kiln_fused_softmax_add_0" in (folder / "kernels.cpp").read_text()
    # without capture's record of the user's ops (a graph from fx.symbolic_trace), the aten names
    assert "kiln_fused_amax_sub_exp_0" in compiled(f, x).kiln_source
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed")
    pytest.importorskip("graphviz")
    assert (folder / "schedule.svg").read_text().startswith("<svg")
    assert (folder / "fx_graph.svg").read_text().startswith("<svg")
