"""Training graphs (kiln.compiler.training): compiled forward and backward equal eager's.

Graphs come the way capture hands them over: fx graphs whose parameters and buffers are
inputs. Functions are traced with torch.fx.symbolic_trace; modules (whose Python control flow
symbolic_trace cannot follow) with make_fx over torch.func.functional_call.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.compiler.grad_modes import compile_training
from kiln.config import compiler_options

INNERS = ["eager", "cpp"]


def compile_for_training(gm, example_inputs, inner, **options):
    return compile_training(gm, example_inputs, compiler_options(None, options), inner)


def fresh(args):
    """Independent copies of args (leaves again, requires_grad kept)."""
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


def run_both(gm, args, inner, loss=lambda outs: sum(o.sum() for o in outs if o.requires_grad), **options):
    """Run gm eagerly and compiled on equal copies of args, backward through `loss` of both;
    check outputs, which outputs require grad, gradients and inputs after the call agree."""
    compiled = compile_for_training(gm, fresh(args), inner, **options)
    eager_args, compiled_args = fresh(args), fresh(args)
    expected, actual = _as_tuple(gm(*eager_args)), _as_tuple(compiled(*compiled_args))
    torch.testing.assert_close(actual, expected)
    assert [a.requires_grad for a in actual] == [e.requires_grad for e in expected]
    loss(expected).backward()
    loss(actual).backward()
    for e, c in zip(eager_args, compiled_args):
        torch.testing.assert_close(c, e)
        torch.testing.assert_close(c.grad, e.grad)
    return compiled, actual


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def module_graph(module, *inputs):
    """`module` as an fx graph over (*parameters, *buffers, *inputs), as capture lifts them;
    returns the graph and its example inputs (the module's own tensors, then inputs)."""
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    names = list(state)

    def call(*args):
        return torch.func.functional_call(module, dict(zip(names, args[:len(names)])),
                                          tuple(args[len(names):]))
    gm = make_fx(call, tracing_mode="fake")(*state.values(), *inputs)
    return gm, [*state.values(), *inputs]


def with_grad_mode_calls(fn):
    """symbolic_trace(fn), with calls `grad_mode(flag, anchor)` turned into
    `torch._C._set_grad_enabled(flag)`, the way capture records `with torch.no_grad():` and
    `torch.enable_grad()` regions."""
    gm = torch.fx.symbolic_trace(fn)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is grad_mode:
            n.target, n.args = torch._C._set_grad_enabled, n.args[:1]
            n.meta.pop("is_wrapped", None)  # else the generated code re-registers it with fx.wrap
    gm.recompile()
    return gm


@torch.fx.wrap
def grad_mode(flag, anchor):
    """Traced only as a marker: fx records a wrapped call only when a traced value (anchor) is
    among its arguments."""
    torch._C._set_grad_enabled(flag)


# --- models --------------------------------------------------------------------------------

def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def mlp_args():
    torch.manual_seed(0)
    return [torch.randn(8, 16, requires_grad=True), torch.randn(32, 16, requires_grad=True),
            torch.randn(32, requires_grad=True), torch.randn(4, 32, requires_grad=True),
            torch.randn(4, requires_grad=True)]


@pytest.mark.parametrize("inner", INNERS)
def test_mlp_gradients_of_inputs_and_parameters(inner):
    run_both(torch.fx.symbolic_trace(mlp), mlp_args(), inner)


@pytest.mark.parametrize("inner", INNERS)
def test_conv_batchnorm_gradients_and_running_stats(inner):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)).train()
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    gm, args = module_graph(net, x)
    run_both(gm, args, inner)  # buffers (running_mean/var, num_batches_tracked) compared too


@pytest.mark.parametrize("inner", INNERS)
def test_batchnorm_running_stats_follow_eager_module(inner):
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(5).train()
    x = torch.randn(6, 5, requires_grad=True)
    gm, args = module_graph(bn, x)
    compiled = compile_for_training(gm, fresh(args), inner)
    reference = copy.deepcopy(bn)
    compiled_args = fresh(args)
    for _ in range(2):
        reference(x).sum().backward()
        compiled(*compiled_args).sum().backward()
    torch.testing.assert_close(compiled_args[2], reference.running_mean)
    torch.testing.assert_close(compiled_args[3], reference.running_var)
    assert int(compiled_args[4]) == int(reference.num_batches_tracked) == 2
    torch.testing.assert_close(compiled_args[0].grad, reference.weight.grad)


@pytest.mark.parametrize("inner", INNERS)
def test_transformer_block(inner):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).train()
    x = torch.randn(2, 5, 16, requires_grad=True)
    gm, args = module_graph(layer, x)
    run_both(gm, args, inner)


# --- what autograd sees ---------------------------------------------------------------------

@pytest.mark.parametrize("inner", INNERS)
def test_inputs_with_and_without_grad(inner):
    def f(x, w, c):
        return (x @ w).tanh() * c
    args = [torch.randn(3, 4), torch.randn(4, 5, requires_grad=True), torch.randn(5)]
    compiled, _ = run_both(torch.fx.symbolic_trace(f), args, inner)
    plain = fresh(args)
    compiled(*plain).sum().backward()
    assert plain[0].grad is None and plain[2].grad is None and plain[1].grad is not None


@pytest.mark.parametrize("inner", INNERS)
def test_outputs_without_grad_and_several_outputs(inner):
    def f(x, w, c):
        y = x * w
        return y.sin(), c.cos(), y.detach() + 1, (y * y).sum(), y.argmax()
    args = [torch.randn(6), torch.randn(6, requires_grad=True), torch.randn(3)]
    _, outs = run_both(torch.fx.symbolic_trace(f), args, inner)
    assert [o.requires_grad for o in outs] == [True, False, False, True, False]


@pytest.mark.parametrize("inner", INNERS)
def test_only_one_output_used_in_backward(inner):
    def f(x, w):
        return x * w, (x + w).exp()
    args = [torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)]
    run_both(torch.fx.symbolic_trace(f), args, inner, loss=lambda outs: outs[1].sum())


@pytest.mark.parametrize("inner", INNERS)
def test_views_and_inplace_on_intermediates(inner):
    def f(x, w):
        y = (x @ w).view(2, 3, 4)
        t = y.transpose(1, 2)
        z = t.clone()
        z[:, 0].mul_(3)            # in place on a view of an intermediate
        z.add_(1)
        s = z.reshape(2, 12)[:, ::2]
        return s.relu(), y.unsqueeze(0).expand(2, 2, 3, 4)
    args = [torch.randn(6, 5, requires_grad=True), torch.randn(5, 4, requires_grad=True)]
    run_both(torch.fx.symbolic_trace(f), args, inner)


@pytest.mark.parametrize("inner", INNERS)
def test_inplace_on_input_without_grad(inner):
    def f(x, w, buf):
        buf.mul_(0.9).add_(x.detach().mean(0))
        return x * w + buf
    args = [torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True), torch.randn(4)]
    run_both(torch.fx.symbolic_trace(f), args, inner)


@pytest.mark.parametrize("inner", INNERS)
def test_inplace_on_non_leaf_input_that_requires_grad(inner):
    def f(a, w):
        a.mul_(w)
        return a.sin()
    leaf, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    compiled = compile_for_training(torch.fx.symbolic_trace(f), [leaf * 1, w], inner)
    results = []
    for fn in (f, compiled):
        leaf_c, w_c = fresh([leaf, w])
        a = leaf_c * 2
        out = fn(a, w_c)
        (out.sum() + a.sum()).backward()   # `a` itself now holds a * w, with that history
        results.append((out, a, leaf_c.grad, w_c.grad))
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.parametrize("inner", INNERS)
def test_inplace_on_leaf_that_requires_grad_raises_like_eager(inner):
    def f(a, w):
        a.mul_(w)
        return a
    args = [torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)]
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(*fresh(args))
    compiled = compile_for_training(torch.fx.symbolic_trace(f), [args[0] * 1, args[1]], inner)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        compiled(*fresh(args))


@pytest.mark.parametrize("inner", INNERS)
def test_no_grad_and_enable_grad_regions(inner):
    def f(x, w):
        a = x * w
        grad_mode(False, a)
        b = a.exp()             # no gradient flows through b
        grad_mode(True, b)
        c = (a + b).sin()
        grad_mode(False, c)
        d = c * 2
        grad_mode(True, d)
        return c + b, d
    gm = with_grad_mode_calls(f)
    assert any(n.target is torch._C._set_grad_enabled for n in gm.graph.nodes)
    args = [torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)]
    _, outs = run_both(gm, args, inner)
    assert outs[1].requires_grad is False
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("inner", INNERS)
def test_parameter_update_under_no_grad_inside_graph(inner):
    def f(x, w):
        loss = (x * w).sum()
        grad_mode(False, loss)
        w.sub_(0.1 * x.sum(0))   # a write autograd does not see, to a leaf that requires grad
        grad_mode(True, w)
        return loss
    args = [torch.randn(3, 4), torch.randn(4, requires_grad=True)]
    run_both(with_grad_mode_calls(f), args, inner)


@pytest.mark.parametrize("inner", INNERS)
def test_detach(inner):
    def f(x, w):
        y = x * w
        return y * y.detach() + y.detach().exp()
    run_both(torch.fx.symbolic_trace(f), [torch.randn(5, requires_grad=True),
                                          torch.randn(5, requires_grad=True)], inner)


@pytest.mark.parametrize("inner", INNERS)
def test_retain_graph(inner):
    gm = torch.fx.symbolic_trace(mlp)
    args = mlp_args()
    compiled = compile_for_training(gm, fresh(args), inner)
    grads = []
    for fn in (gm, compiled):
        a = fresh(args)
        out = fn(*a).sum()
        out.backward(retain_graph=True)
        out.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            out.backward()
        grads.append([t.grad for t in a])
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("inner", INNERS)
def test_double_backward_is_a_clear_error(inner):
    def f(x):
        return x.sin()
    x = torch.randn(4, requires_grad=True)
    compiled = compile_for_training(torch.fx.symbolic_trace(f), [x], inner)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(compiled(x).sum(), x)   # a plain backward still works
    torch.testing.assert_close(g, x.cos())


@pytest.mark.parametrize("inner", INNERS)
def test_dropout_uses_one_mask_forward_and_backward(inner):
    def f(x, w):
        return F.dropout(x * w, 0.5, training=True)
    x, w = torch.rand(64, requires_grad=True) + 1, torch.ones(64, requires_grad=True)
    compiled = compile_for_training(torch.fx.symbolic_trace(f), [x, w], inner)
    out = compiled(x, w)
    out.sum().backward()
    kept = (out != 0).float()
    assert 0 < kept.sum() < 64
    torch.testing.assert_close(w.grad, kept * 2 * x.detach())


@pytest.mark.parametrize("inner", INNERS)
def test_dropout_with_fallback_random_equals_eager_under_one_seed(inner):
    def f(x, w):
        return F.dropout(x @ w, 0.3, training=True).tanh()
    args = [torch.randn(8, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)]
    gm = torch.fx.symbolic_trace(f)
    compiled = compile_for_training(gm, fresh(args), inner, fallback_random=True)
    results = []
    for fn in (gm, compiled):
        a = fresh(args)
        torch.manual_seed(1234)
        out = fn(*a)
        out.sum().backward()
        results.append((out, a[0].grad, a[1].grad))
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.parametrize("inner", INNERS)
def test_five_sgd_steps_give_eager_losses(inner):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 20), nn.Tanh(), nn.Linear(20, 1))
    data, target = torch.randn(16, 10), torch.randn(16, 1)

    def step_loss(w1, b1, w2, b2, x, y):
        return F.mse_loss(F.linear(torch.tanh(F.linear(x, w1, b1)), w2, b2), y)
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    compiled = compile_for_training(torch.fx.symbolic_trace(step_loss), [*params, data, target], inner)
    losses = {}
    for name, fn in (("eager", step_loss), ("compiled", compiled)):
        ps = fresh(params)
        losses[name] = []
        for _ in range(5):
            loss = fn(*ps, data, target)
            loss.backward()
            with torch.no_grad():
                for p in ps:
                    p.sub_(0.1 * p.grad)
                    p.grad = None
            losses[name].append(loss.item())
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-5)
    assert losses["eager"][-1] < losses["eager"][0]


# --- calls that differ from the example inputs ---------------------------------------------

@pytest.mark.parametrize("inner", INNERS)
def test_call_under_no_grad_and_with_other_requires_grad(inner):
    gm = torch.fx.symbolic_trace(mlp)
    args = mlp_args()
    compiled = compile_for_training(gm, fresh(args), inner)
    with torch.no_grad():
        out = compiled(*fresh(args))
    assert not out.requires_grad
    torch.testing.assert_close(out, gm(*args).detach())
    only_x = fresh(args)
    for p in only_x[1:]:
        p.requires_grad_(False)
    compiled(*only_x).sum().backward()
    eager_x = fresh(only_x)
    gm(*eager_x).sum().backward()
    torch.testing.assert_close(only_x[0].grad, eager_x[0].grad)


@pytest.mark.parametrize("inner", INNERS)
def test_outputs_that_are_inputs_or_views_of_them(inner):
    def f(x, w, buf):
        buf.mul_(2)
        return x.t(), x[1], w, buf, x * w
    args = [torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True), torch.randn(4)]
    compiled = compile_for_training(torch.fx.symbolic_trace(f), fresh(args), inner)
    compiled_args = fresh(args)
    outs = compiled(*compiled_args)
    assert outs[0].data_ptr() == compiled_args[0].data_ptr()   # aliases, as eager returns them
    assert outs[2] is compiled_args[1] and outs[3] is compiled_args[2]
    run_both(torch.fx.symbolic_trace(f), args, inner,
             loss=lambda outs: outs[0].sum() * 2 + outs[1].sum() + outs[4].sum())


@pytest.mark.parametrize("inner", INNERS)
def test_parameters_read_through_get_attr_get_gradients(inner):
    """A graph from symbolic_trace of a module reads its parameters as attributes, not inputs;
    compile_fx must still train them, even when no input requires grad."""
    from kiln.compiler import compile_fx
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)).train()
    reference = copy.deepcopy(model)
    x = torch.randn(5, 6)
    compiled = compile_fx(torch.fx.symbolic_trace(model), [x], compiler_options(), inner)
    out = compiled(x)
    expected = reference(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    for b, c in zip(model.buffers(), reference.buffers()):
        torch.testing.assert_close(b, c)


@pytest.mark.parametrize("inner", INNERS)
def test_symbolic_batch_size(inner):
    """With dynamic shapes capture hands fake inputs with symbolic sizes; sizes the backward
    needs are saved as values, and one compiled graph serves every batch size."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    def f(x, w, b):
        y = F.gelu(F.linear(x, w, b))
        return (y * y.shape[0]).sum()
    mode = FakeTensorMode(shape_env=ShapeEnv())
    w, b = torch.randn(4, 8, requires_grad=True), torch.randn(4, requires_grad=True)
    dynamic_batch = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    example = [mode.from_tensor(torch.randn(5, 8), symbolic_context=dynamic_batch),
               mode.from_tensor(w), mode.from_tensor(b)]
    compiled = compile_for_training(torch.fx.symbolic_trace(f), example, inner)
    for batch in (5, 9):
        x = torch.randn(batch, 8)
        (gw, gb) = torch.autograd.grad(compiled(x, w, b), (w, b))
        expected = torch.autograd.grad(f(x, w, b), (w, b))
        torch.testing.assert_close((gw, gb), expected)
    assert len(compiled.variants) == 1


def test_backward_is_compiled_at_its_first_call_and_kept(monkeypatch):
    import kiln.compiler.training as training
    compiled_graphs = []
    real_compile = training._compile_graph

    def counting_compile(gm, *args):
        compiled_graphs.append(gm)
        return real_compile(gm, *args)
    monkeypatch.setattr(training, "_compile_graph", counting_compile)
    args = mlp_args()
    compiled = compile_for_training(torch.fx.symbolic_trace(mlp), fresh(args), "eager")
    assert len(compiled_graphs) == 1            # the forward only
    out = compiled(*fresh(args))
    assert len(compiled_graphs) == 1
    out.sum().backward()
    assert len(compiled_graphs) == 2            # the backward, at its first call
    for _ in range(2):
        compiled(*fresh(args)).sum().backward()
    assert len(compiled_graphs) == 2


@pytest.mark.parametrize("inner", INNERS)
def test_inplace_through_views_of_inputs(inner):
    def f(a, w, buf):
        a[1:].mul_(w[1:])            # a slice of an input that requires grad (a non-leaf)
        buf[0].add_(a.detach()[0])   # a row of a buffer
        return (a * buf).sum()
    leaf, w = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    buf = torch.randn(4, 3)
    compiled = compile_for_training(torch.fx.symbolic_trace(f), [leaf * 1, w, buf], inner)
    results = []
    for fn in (f, compiled):
        leaf_c, w_c, buf_c = fresh([leaf, w, buf])
        a = leaf_c * 2
        loss = fn(a, w_c, buf_c)
        (loss + a.sum()).backward()
        results.append((loss, a, buf_c, leaf_c.grad, w_c.grad))
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.parametrize("inner", INNERS)
def test_tensor_constants_created_inside_the_graph(inner):
    """make_fx turns a tensor the graph creates from Python values (torch.tensor) into a constant
    attribute of the traced graph; the forward and backward graphs must keep it."""
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    scale = graph.call_function(torch.tensor, (3.0,))
    graph.output(graph.call_function(torch.mul, (graph.call_function(torch.mul, (x, w)), scale)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    run_both(gm, [torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)], inner)


def test_views_of_an_expanded_input_get_eager_gradients():
    """Outputs that view an input whose elements share memory (an expanded leaf): rebuilt by
    as_strided, the gradient of `a.select(1, 4)` was spread over the 7 elements at each location
    (found by tests/compiler/test_fuzz_training.py); eager gives it to the elements viewed."""
    import kiln

    def views(a):
        return a.select(1, 4), a[1:], a.unbind(2)[2], a.transpose(1, 2), a.split(1, 0)[1] * 2

    base = torch.randn(2, 5, 1)
    weights = [torch.randn(s) for s in ((2, 7), (1, 5, 7), (2, 5), (2, 7, 5), (1, 5, 7))]
    grads = []
    for fn in (views, kiln.compile(views)):
        a = base.expand(2, 5, 7).requires_grad_()
        outs = fn(a)
        sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        grads.append((outs, a.grad))
        assert outs[0].data_ptr() == a.data_ptr() + 4 * a.element_size()  # still views, as in eager
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("reduction", ["max", "min", "median", "nanmedian"])
def test_full_reductions_give_eager_gradients_when_the_gradient_is_not_finite(reduction):
    """x.max() etc. split the gradient evenly among the elements equal to the result; eager's CPU
    kernel leaves every other element's gradient 0 even when the gradient is NaN or inf, where the
    traced formula's `mask * share` made it NaN (found by tests/compiler/test_fuzz_training.py)."""
    import kiln

    def nan_gradient(x, y):
        return torch.acos(getattr(x, reduction)() + 2)  # acos of >1: NaN, and its gradient too

    def infinite_gradient(x, y):
        return getattr(x, reduction)() * y

    x = torch.tensor([[1.0, 3.0, -2.0], [3.0, 0.5, -2.0]])  # ties at the max and the min
    y = torch.tensor(float("inf"))
    for f in (nan_gradient, infinite_gradient):
        grads = []
        for fn in (f, kiln.compile(f)):
            xs = x.clone().requires_grad_()
            fn(xs, y).backward()
            grads.append(xs.grad)
        torch.testing.assert_close(grads[1], grads[0], equal_nan=True)


def test_a_chunk_of_a_strided_view_of_an_input_is_saved_as_a_tensor():
    """The backward of sqrt(a[::2].chunk(2)[0]) reads the chunk: the partitioner saved the whole
    split's list (a view of an input, so it looked free), which no graph can return (KeyError in
    the schedule; found by tests/compiler/test_fuzz_training.py)."""
    import kiln

    def f(a):
        t = a[::2].chunk(2, 0)[0]
        return t, t.sqrt()

    grads = []
    for fn in (f, kiln.compile(f)):
        a = torch.linspace(0.5, 2, 120).reshape(8, 3, 5).requires_grad_()
        outs = fn(a)
        (outs[0].sum() + outs[1].sum()).backward()
        grads.append(a.grad)
    torch.testing.assert_close(grads[1], grads[0])
