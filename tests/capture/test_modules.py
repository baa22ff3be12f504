"""nn.Modules: built-in and custom modules inlined down to forward, hooks honoured, parameters and
buffers by attribute, the returned module shares parameters, train/eval, BatchNorm buffers."""
import pytest
import torch
from torch import nn

import kiln
from tests.utils import CompileCounter, assert_equal_state, check_graphs

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, d=8, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(depth)])
        self.act = nn.GELU()

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return x


class WithDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)})

    def forward(self, x):
        return {name: head(x) for name, head in self.heads.items()}


class ParamsAndBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8))
        self.register_buffer("offset", torch.arange(8.0))
        self.scale = 0.5

    def forward(self, x):
        return x * self.weight * self.scale + self.offset


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return x + self.inner(self.norm(x))


class Parent(nn.Module):
    def forward(self, x):
        return x * 2


class ChildModule(Parent):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return super().forward(self.lin(x)) + 1


class BufferUpdate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps += 1
        return x * self.steps


class ModuleAttributeSet(nn.Module):
    def forward(self, x):
        self.last_mean = x.mean()
        self.calls = getattr(self, "calls", 0) + 1
        return x - self.last_mean


class UsesNamedParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        total = sum(p.sum() for p in self.parameters())
        names = [n for n, _ in self.named_parameters()]
        return self.b(self.a(x)) + total + len(names)


class UsesChildren(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, x):
        for m in self.seq.children():
            if isinstance(m, nn.Linear):
                x = m(x)
        return x + len(self.seq) + self.seq[-1].weight.sum()


class NamedLayers(nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.depth = depth
        for i in range(depth):
            setattr(self, f"layer{i}", nn.Linear(8, 8))

    def forward(self, x):
        for i in range(self.depth):
            x = getattr(self, f"layer{i}")(x).tanh()
        return x


class ZippedLists(nn.Module):
    def __init__(self):
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.norms = nn.ModuleList([nn.LayerNorm(8) for _ in range(3)])

    def forward(self, x):
        for i, (lin, norm) in enumerate(zip(self.linears, self.norms)):
            if i == len(self.linears) - 1:
                x = self.linears[-1](x)
            else:
                x = norm(lin(x))
        return x


class KeywordForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, *, scale=1.0, mask=None):
        y = self.lin(x) * scale
        return y if mask is None else y.masked_fill(mask, 0.0)


def make_models():
    return {
        "linear": lambda: nn.Linear(8, 4),
        "sequential": lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh()),
        "module_list_loop": lambda: MLP(),
        "module_dict": lambda: WithDict(),
        "params_and_buffers": lambda: ParamsAndBuffers(),
        "nested_residual": lambda: Residual(MLP(depth=2)),
        "super_forward": lambda: ChildModule(),
        "named_parameters_children": lambda: UsesNamedParameters(),
        "sequential_children": lambda: UsesChildren(),
        "conv_pool": lambda: nn.Sequential(nn.Unflatten(1, (2, 2, 2)), nn.Conv2d(2, 3, 1), nn.MaxPool2d(2),
                                           nn.Flatten()),
        "layernorm_dropout_eval": lambda: nn.Sequential(nn.LayerNorm(8), nn.Dropout(0.3)).eval(),
        "embedding": lambda: nn.Sequential(nn.Embedding(10, 8)),
        "multihead_attention_eval": lambda: MHA().eval(),
        "getattr_fstring_names": lambda: NamedLayers(),
        "zip_module_lists": lambda: ZippedLists(),
        "gru_cell": lambda: nn.GRUCell(8, 8),
    }


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def input_for(name):
    if name == "embedding":
        return torch.tensor([[1, 2, 3], [4, 5, 9]])
    if name == "multihead_attention_eval":
        return torch.randn(2, 5, 8)
    return torch.randn(4, 8)


@pytest.mark.parametrize("name", list(make_models()))
def test_module_one_graph_matches_eager(name):
    model = make_models()[name]()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = input_for(name)
    with torch.no_grad():
        assert_equal_state(compiled(x), model(x))
    assert counter.frame_count == 1


def test_compiled_module_shares_parameters():
    model = nn.Linear(8, 4)
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 8)
    compiled(x)
    with torch.no_grad():
        model.weight.mul_(2)  # in-place change of the shared parameter is seen by the compiled module
    torch.testing.assert_close(compiled(x), model(x))
    assert all(any(p is q for q in compiled.parameters()) for p in model.parameters())


def test_compiled_module_training_gradients_match_eager():
    model = MLP()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(4, 8)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled(x).sum().backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e)


def test_buffer_mutation_in_forward_matches_eager():
    eager, model = BufferUpdate(), BufferUpdate()
    compiled = kiln.compile(model, backend=CompileCounter())
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(model.steps, eager.steps)


def test_module_attribute_set_in_forward_replayed():
    eager, model = ModuleAttributeSet(), ModuleAttributeSet()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(5)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), eager(x))
    assert model.calls == eager.calls == 2
    torch.testing.assert_close(model.last_mean, eager.last_mean)


def test_batchnorm_train_updates_running_stats():
    eager = nn.BatchNorm1d(8)
    model = nn.BatchNorm1d(8)
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    for _ in range(2):
        x = torch.randn(6, 8)
        torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(model.running_mean, eager.running_mean)
    torch.testing.assert_close(model.running_var, eager.running_var)
    assert model.num_batches_tracked.item() == eager.num_batches_tracked.item() == 2
    assert counter.frame_count == 1


def test_train_eval_switch_recompiles_and_stays_correct():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.0))
    eager = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.0))
    eager.load_state_dict(model.state_dict())
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), eager(x))
    compiled.eval()
    eager.eval()
    assert not model.training
    torch.testing.assert_close(compiled(x), eager(x))
    assert counter.frame_count == 2
    compiled.train()
    eager.train()
    torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(model[1].running_mean, eager[1].running_mean)
    assert counter.frame_count == 2  # both entries are cached


def log_input(store):
    def hook(module, args):
        store.append(args[0].shape)
    return hook


@pytest.mark.parametrize("register", [
    lambda m: m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,)),  # modifies the input
    lambda m: m.register_forward_hook(lambda mod, args, out: out.relu() + 1),  # modifies the output
], ids=["pre_hook_modifies_input", "hook_modifies_output"])
def test_forward_hooks_honoured_in_one_graph(register):
    model = nn.Linear(8, 4)
    register(model)
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


def test_hooks_on_submodules_honoured():
    model = MLP(depth=2)
    model.layers[0].register_forward_hook(lambda m, args, out: out * 0)
    model.layers[1].register_forward_pre_hook(lambda m, args: (args[0] + 3,))
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), model(x))


def test_hook_side_effect_on_python_list_replayed():
    seen, eager_seen = [], []
    model = nn.Linear(8, 4)
    handle = model.register_forward_pre_hook(log_input(seen))
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(3, 8)
    out = compiled(x)
    handle.remove()
    model.register_forward_pre_hook(log_input(eager_seen))
    torch.testing.assert_close(out, model(x))
    assert seen == eager_seen == [torch.Size([3, 8])]


def test_compiled_function_calling_module():
    model = MLP()

    def f(x):
        return model(x).sum(-1)
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 1


def test_module_passed_as_argument():
    def f(m, x):
        return m(x) * 2
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    m, x = nn.Linear(8, 2), torch.randn(3, 8)
    torch.testing.assert_close(compiled(m, x), f(m, x))
    assert counter.frame_count == 1


def test_state_dict_of_compiled_module_roundtrip():
    model = MLP()
    compiled = kiln.compile(model, backend="eager")
    other = MLP()
    other.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in compiled.state_dict().items()})
    x = torch.randn(2, 8)
    torch.testing.assert_close(other(x), compiled(x))


def test_module_keyword_arguments():
    model = KeywordForward()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(3, 8)
    mask = torch.rand(3, 8) > 0.5
    torch.testing.assert_close(compiled(x, scale=2.0, mask=mask), model(x, scale=2.0, mask=mask))
    assert counter.frame_count == 1


def test_module_star_args_call():
    model = nn.Bilinear(4, 5, 2)

    def f(inputs):
        return model(*inputs)
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    inputs = (torch.randn(3, 4), torch.randn(3, 5))
    torch.testing.assert_close(compiled(inputs), f(inputs))
    assert counter.frame_count == 1


def test_user_callable_object():
    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, t):
            return t * self.k

    def f(x, op):
        return op(x) + 1
    check_graphs(f, torch.randn(3), Scale(4.0), graphs=1)


def test_python_list_attribute_changed_between_calls():
    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.skip = []

        def forward(self, x):
            return x if "lin" in self.skip else self.lin(x)
    model = Gated()
    compiled = kiln.compile(model, backend=CompileCounter())
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), model(x))
    model.skip.append("lin")
    torch.testing.assert_close(compiled(x), x)


class WalksModules(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.Linear(8, 8))

    def forward(self, x):
        n_dropout = sum(isinstance(m, nn.Dropout) for m in self.modules())
        names = [name for name, _ in self.named_modules()]
        n_buffers = len(list(self.named_buffers()))
        return self.body(x) * n_dropout + len(names) + n_buffers


def test_modules_and_named_modules_inside_forward():
    model = WalksModules().eval()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


def test_lazy_submodule_created_in_forward():
    class Lazy(nn.Module):
        def forward(self, x):
            if not hasattr(self, "proj"):
                self.proj = nn.Linear(x.shape[-1], 2)
            return self.proj(x)
    torch.manual_seed(0)
    model = Lazy()
    compiled = kiln.compile(model, backend=CompileCounter())
    x = torch.randn(3, 5)
    out = compiled(x)
    assert isinstance(model.proj, nn.Linear)
    torch.testing.assert_close(out, model(x))



class ModuleIdioms(nn.Module):
    def __init__(self):
        super(ModuleIdioms, self).__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Identity(), nn.Linear(8, 8, bias=False)])
        self.scales = nn.ParameterList([nn.Parameter(torch.rand(8)) for _ in range(2)])
        self.extra = nn.ParameterDict({"shift": nn.Parameter(torch.randn(8))})
        self.register_parameter("unused_bias", None)

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(iter(self.scales)).dtype

    def forward(self, x):
        x = x.to(self.device, self.dtype)
        for layer in self.layers[:2]:
            x = layer(x)
        last = self.layers[-1]
        if getattr(last, "bias", None) is None and self.unused_bias is None:
            x = last(x)
        for s in self.scales:
            x = x * s
        return x + self.extra["shift"] + sum(p.numel() for p in self.extra.values())


def test_common_module_idioms_one_graph():
    model = ModuleIdioms()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


@pytest.mark.kiln_only
def test_parameters_are_read_through_each_module_once_per_call():
    """The glue reads a model's parameters through their shared module paths once (glue._SharedBases),
    and reads them anew on each call: a replaced parameter is the one the next call uses."""
    def run(model, x):
        return model(x)
    model = nn.Sequential(MLP(), MLP())
    compiled = kiln.compile(run, backend="eager")
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(model, x), run(model, x))
    (entry,) = compiled.__kiln_compiled__._kiln_cache.entries
    assert entry.glue_src.count("['layers']") == 2, entry.glue_src  # once per MLP, not once per weight
    with torch.no_grad():
        model[1].layers[2].weight = nn.Parameter(torch.randn(8, 8))
        model[0].layers[0].bias.add_(1)
    torch.testing.assert_close(compiled(model, x), run(model, x))


@pytest.mark.kiln_only
def test_each_module_forward_is_guarded_once():
    """A module's hooks and its forward coming from its class are two guards, so the forward check that
    reading `forward` adds is the same guard, not a second one (guards run on every call)."""
    model = MLP()
    compiled = kiln.compile(lambda m, x: m(x), backend="eager")
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(model, x), model(x))
    (entry,) = compiled.__kiln_compiled__._kiln_cache.entries
    forward_checks = [g for g in entry.guards if "'forward'" in (g.check or '')]
    assert len(forward_checks) == len({g.source.key() for g in forward_checks}), forward_checks
    model.layers[1].forward = lambda x: x * 0  # set on the instance: the guard sees it
    torch.testing.assert_close(compiled(model, x), model(x))
