"""The aot step: functional aten graphs, write-back of mutated inputs and buffers, output aliasing.

Graphs run through `make_runner(aten, aten.gm)`: the aten graph itself executed by torch, so these
tests check aot alone. Eager is the oracle, for results and for the inputs' state after the call.
"""
import copy
import operator

import pytest
import torch
import torch.fx

import kiln

from kiln.compiler.aot import AotUnsupported, make_runner, trace_aten, lowering_decompositions
from tests.utils import assert_equal_state, clone_args

aten = torch.ops.aten


def compile_aot(fn, args):
    gm = fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)
    aten_graph = trace_aten(gm, args)
    return aten_graph, make_runner(aten_graph, aten_graph.gm)


def check(fn, *args):
    """Eager and aot runs on equal copies: same results, same inputs afterwards."""
    aten_graph, run = compile_aot(fn, clone_args(args))
    eager_args, aot_args = clone_args(args), clone_args(args)
    expected, actual = fn(*eager_args), run(*aot_args)
    assert_equal_state(actual, expected)
    assert_equal_state(aot_args, eager_args)
    return aten_graph, actual, aot_args


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def assert_functional(gm):
    for target in targets(gm):
        if isinstance(target, torch._ops.OpOverload):
            assert not target._schema.is_mutable, f"{target} mutates"


def test_graph_is_decomposed_aten():
    def f(x, w):
        return torch.nn.functional.gelu(x @ w).softmax(-1)

    aten_graph, _, _ = check(f, torch.randn(4, 8), torch.randn(8, 3))
    for target in targets(aten_graph.gm):
        assert target is operator.getitem or isinstance(target, torch._ops.OpOverload), target
    assert aten.mm.default in targets(aten_graph.gm)          # heavy op kept whole
    assert aten._softmax.default not in targets(aten_graph.gm)  # softmax broken into fusible parts
    assert aten.exp.default in targets(aten_graph.gm)
    assert aten_graph.mutated_inputs == [] and aten_graph.num_user_outputs == 1


def test_placeholders_are_the_flat_inputs():
    def f(x, y, z):
        return x + 1

    aten_graph, _, _ = check(f, torch.randn(3), torch.randn(3), torch.randn(3))
    assert len(aten_graph.gm.graph.find_nodes(op="placeholder")) == 3


def test_inplace_on_input_is_written_back():
    def f(x, y):
        x.add_(1)
        y.mul_(2).sub_(x)
        return (x * y).sum()

    aten_graph, _, _ = check(f, torch.randn(4), torch.randn(4))
    assert aten_graph.mutated_inputs == [0, 1]
    assert_functional(aten_graph.gm)
    outputs = aten_graph.gm.graph.output_node().args[0]
    assert len(outputs) == aten_graph.num_user_outputs + 2


def test_copy_into_input_with_broadcast_and_cast():
    def f(buf, src):
        buf.copy_(src * 2)
        return buf + 1

    buf = torch.zeros(3, 4, dtype=torch.float64)
    aten_graph, _, _ = check(f, buf, torch.randn(4))
    assert aten_graph.mutated_inputs == [0]
    assert_functional(aten_graph.gm)


@pytest.mark.parametrize("order", ["xy", "yx"])
def test_write_backs_read_old_values(order):
    def f(x, y):
        if order == "xy":
            x.copy_(y)
            y.add_(1)
        else:
            y.add_(1)
            x.copy_(y)
        return x * y

    check(f, torch.randn(3), torch.randn(3))
    check(lambda y, x: f(x, y), torch.randn(3), torch.randn(3))


def test_mutation_through_a_view_of_an_input():
    def f(x):
        x[1:].mul_(10)
        x.t()[0].fill_(-1)
        return x.sum(0)

    check(f, torch.randn(3, 3))


def test_unmutated_input_is_not_written():
    def f(x, y):
        return x + y

    aten_graph, _, _ = check(f, torch.randn(2), torch.randn(2))
    assert aten_graph.mutated_inputs == []


def test_output_that_is_a_mutated_input_is_that_input():
    def f(x):
        return x.add_(1)

    _, out, args = check(f, torch.randn(3))
    assert out is args[0]


def test_output_views_of_inputs_share_their_storage():
    def f(x, y):
        x.mul_(2)
        return x.view(-1), y.t(), y[1:, ::2], y + 1

    aten_graph, out, args = check(f, torch.randn(2, 3), torch.randn(3, 4))
    x, y = args
    assert out[0].data_ptr() == x.data_ptr()
    assert out[1].stride() == y.t().stride() and out[1].data_ptr() == y.data_ptr()
    assert out[2].stride() == y[1:, ::2].stride() and out[2].storage_offset() == y[1:, ::2].storage_offset()
    assert out[3].data_ptr() != y.data_ptr()
    assert sorted(a.output_index for a in aten_graph.output_aliases) == [0, 1, 2]
    out[1][0, 0] = 123.0  # as in eager, writing the view writes the input
    assert y[0, 0] == 123.0


def test_fresh_output_copied_into_an_input_does_not_alias_it():
    def f(x):
        y = x * 3
        x.copy_(y)
        return y

    _, out, args = check(f, torch.randn(3))
    assert out.data_ptr() != args[0].data_ptr()


def test_output_structure_is_rebuilt():
    def f(x):
        return {"a": x + 1, "b": [x * 2, (x - 1,)]}

    check(f, torch.randn(2))


def test_single_tensor_output():
    def f(x):
        return x.relu()

    _, out, _ = check(f, torch.randn(5))
    assert isinstance(out, torch.Tensor)


def test_batchnorm_train_updates_running_stats():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    compiled_model = copy.deepcopy(model)
    aten_graph, run = compile_aot(torch.fx.symbolic_trace(compiled_model), [torch.randn(2, 3, 6, 6)])
    assert len(aten_graph.mutated_attrs) == 3  # running_mean, running_var, num_batches_tracked
    assert_functional(aten_graph.gm)
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6)
        torch.testing.assert_close(run(x), model(x))
    for (name, expected), actual in zip(model.state_dict().items(), compiled_model.state_dict().values()):
        torch.testing.assert_close(actual, expected, msg=name)
    assert compiled_model[1].num_batches_tracked.item() == 2


def test_batchnorm_buffers_as_inputs_are_written_back():
    """The capture half hands buffers over as graph inputs: they are written back as inputs."""
    def f(x, running_mean, running_var, weight, bias):
        return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training=True)

    aten_graph, _, _ = check(f, torch.randn(8, 4), torch.zeros(4), torch.ones(4), torch.randn(4), torch.randn(4))
    assert aten_graph.mutated_inputs == [1, 2]


def test_parameters_are_attributes_sharing_storage():
    lin = torch.nn.Linear(3, 2)
    aten_graph, run = compile_aot(torch.fx.symbolic_trace(lin), [torch.randn(4, 3)])
    with torch.no_grad():
        lin.weight.mul_(2)  # an optimizer step in place: the compiled graph must see it
    x = torch.randn(4, 3)
    torch.testing.assert_close(run(x), lin(x))


def test_fake_example_inputs_are_accepted():
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    real = [torch.randn(3, 4), torch.randn(4)]
    fake = [mode.from_tensor(t) for t in real]

    def f(x, b):
        return (x + b).sum(1)

    aten_graph = trace_aten(torch.fx.symbolic_trace(f), fake)
    run = make_runner(aten_graph, aten_graph.gm)
    torch.testing.assert_close(run(*real), f(*real))


def test_symbolic_example_values_make_a_graph_for_every_size():
    """Capture marks dynamic sizes in the placeholders' fake example values, while the example
    inputs are real: the aten graph must follow the symbolic sizes, not the example's."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    mode = FakeTensorMode(shape_env=ShapeEnv())

    def f(x, y):
        return (x * 2 + y).softmax(-1).sum(0), x.reshape(-1)

    gm = torch.fx.symbolic_trace(f)
    x, y = torch.randn(3, 4), torch.randn(4)
    dynamic_rows = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fakes = [mode.from_tensor(x, symbolic_context=dynamic_rows), mode.from_tensor(y)]
    for node, fake in zip(gm.graph.find_nodes(op="placeholder"), fakes):
        node.meta["example_value"] = fake
    aten_graph = trace_aten(gm, [x, y])
    run = make_runner(aten_graph, aten_graph.gm)
    for rows in (3, 5, 9):
        x = torch.randn(rows, 4)
        assert_equal_state(run(x, y), f(x, y))


def test_reshaping_an_input_in_place_is_refused():
    def f(x):
        x.t_()
        return x + 1

    with pytest.raises(AotUnsupported, match="shape of input 0"):
        trace_aten(torch.fx.symbolic_trace(f), [torch.randn(2, 3)])


def test_transposing_a_square_input_in_place_keeps_its_values():
    def f(x):
        x.t_()
        return x + 1

    check(f, torch.randn(3, 3))


def test_mutating_an_input_that_shares_memory_with_another_is_refused():
    def f(x, y):
        x.add_(1)
        return y * 2

    base = torch.randn(4)
    with pytest.raises(AotUnsupported, match="shares memory"):
        trace_aten(torch.fx.symbolic_trace(f), [base, base[:2]])


@pytest.mark.parametrize("fn", [lambda x: torch.equal(x, x), lambda x: torch.nn.functional.one_hot(x),
                                lambda x: torch.tensor_split(x, x)],
                         ids=["equal", "one_hot_sized_by_max", "tensor_split_at_tensor_indices"])
def test_value_dependent_graph_is_refused(fn):
    with pytest.raises(AotUnsupported, match="depends on tensor values"):
        trace_aten(torch.fx.symbolic_trace(fn), [torch.tensor([0, 3, 1])])


def test_compile_fx_runs_a_refused_graph_eagerly():
    from kiln.compiler import compile_fx

    def f(x, y):
        return torch.equal(x, y), x + y

    x = torch.randn(3)
    compiled = compile_fx(torch.fx.symbolic_trace(f), [x, x.clone()])
    assert_equal_state(compiled(x, x.clone()), f(x, x.clone()))
    assert compiled(x, x + 1)[0] is False


def test_sparse_input_is_refused():
    with pytest.raises(AotUnsupported, match="sparse_coo"):
        trace_aten(torch.fx.symbolic_trace(lambda x: x * 2), [torch.eye(3).to_sparse()])


def test_aten_graph_is_logged(caplog):
    from kiln.debug import logs

    def f(x):
        return x.cos()

    logs.set_logs("aot")
    try:
        trace_aten(torch.fx.symbolic_trace(f), [torch.randn(2)])
    finally:
        logs.set_logs("")
    assert "aten.cos.default" in caplog.text


def test_lowering_table_keeps_heavy_ops_whole():
    table = lowering_decompositions()
    for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default):
        assert op not in table
    for op in (aten._softmax.default, aten.native_layer_norm.default, aten.addcmul.default):
        assert op in table
    random_ops = [op for op in table if torch.Tag.nondeterministic_seeded in op.tags]
    assert random_ops and not any(op in lowering_decompositions(fallback_random=True) for op in random_ops)


def test_mutated_input_aliased_by_another_input_on_a_later_call():
    # compiled for independent inputs, then called with aliased or overlapping ones: the functional
    # graph read y before x's write (2 where eager gives 3); such calls now run the graph eagerly
    def g(x, y):
        x.mul_(2)
        return y + 1

    def calls():
        base = torch.arange(6.0)
        t = torch.ones(3)
        return [(torch.ones(3), torch.ones(3)), (t, t), (base[1:4], base[:3]), (base[:3], base[3:])]
    kiln.reset()
    compiled = kiln.compile(g)
    for (x, y), (ex, ey) in zip(calls(), calls()):
        torch.testing.assert_close(compiled(x, y), g(ex, ey), rtol=0, atol=0)
        torch.testing.assert_close((x, y), (ex, ey), rtol=0, atol=0)
