"""The public surface: argument checks, decorator forms, module wrapper, registry, config."""
import pytest
import torch

import kiln


def add_one(x):
    return x + 1


def test_decorator_forms_match_eager():
    @kiln.compile
    def f(x):
        return x * 2

    @kiln.compile(backend="eager", fullgraph=False)
    def g(x):
        return x - 3

    x = torch.randn(4)
    torch.testing.assert_close(f(x), x * 2)
    torch.testing.assert_close(g(x), x - 3)
    assert f.__name__ == "f" and g.__name__ == "g"


def test_disable_true_returns_model_unchanged():
    assert kiln.compile(add_one, disable=True) is add_one


@pytest.mark.parametrize("bad, match", [
    (dict(backend="nope"), "invalid backend 'nope'.*eager"),
    (dict(mode="fast"), "unknown mode 'fast'.*reduce-overhead"),
    (dict(mode="default", options={}), "either mode or options"),
    (dict(options={"bogus": 1}), "unknown option.*bogus.*epilogue_fusion"),
    (dict(options=[1]), "options must be a dict"),
    (dict(fullgraph="yes"), "fullgraph must be True or False"),
    (dict(dynamic="maybe"), "dynamic must be None, True or False"),
    (dict(backend=3), "backend must be a name or a callable"),
])
def test_bad_arguments_are_clear_errors(bad, match):
    with pytest.raises(kiln.InvalidArgument, match=match):
        kiln.compile(add_one, **bad)


def test_non_callable_model_is_an_error():
    with pytest.raises(kiln.InvalidArgument, match="function or nn.Module.*int"):
        kiln.compile(5)
    with pytest.raises(TypeError):  # InvalidArgument is a TypeError too
        kiln.compile("not a function")


def test_module_wrapper_shares_parameters_and_state():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    compiled = kiln.compile(model, backend="eager")
    assert isinstance(compiled, torch.nn.Module) and compiled._orig_mod is model
    model.scale = 0.5
    assert compiled.scale == 0.5  # attribute access reaches the original
    assert [p for p in compiled.parameters()] == [p for p in model.parameters()]
    assert {k.removeprefix("_orig_mod.") for k in compiled.state_dict()} == set(model.state_dict())
    compiled.eval()
    assert not model.training
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(x), model(x))


def test_deepcopy_of_a_compiled_module_runs_the_copy():
    import copy
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 3)
    compiled(x)
    twin = copy.deepcopy(compiled)
    assert twin._orig_mod is not model and isinstance(twin, type(compiled))
    with torch.no_grad():
        twin._orig_mod[0].weight.mul_(-2)  # the copy's parameters only
    torch.testing.assert_close(twin(x), twin._orig_mod(x))
    torch.testing.assert_close(compiled(x), model(x))
    twin(x).sum().backward()  # gradients reach the copy's parameters, not the original's
    assert twin._orig_mod[0].weight.grad is not None and model[0].weight.grad is None


def test_list_backends_and_register():
    assert "inductor" in kiln.list_backends()
    assert "eager" not in kiln.list_backends() and "eager" in kiln.list_backends(None)
    seen = []

    @kiln.register_backend(name="test_api_counting")
    def counting(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    assert "test_api_counting" in kiln.list_backends()
    with pytest.raises(kiln.InvalidArgument, match="already registered"):
        kiln.register_backend(counting, name="test_api_counting")

    def plain(gm, example_inputs):
        return gm.forward
    assert kiln.register_backend(plain) is plain and "plain" in kiln.list_backends()
    with pytest.raises(kiln.InvalidArgument):
        kiln.register_backend(42)


def test_mode_and_option_listings():
    modes = kiln.list_mode_options()
    assert set(modes) == {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}
    assert modes["max-autotune"]["max_autotune"] is True
    assert kiln.list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
    opts = kiln.list_options()
    for name in ("epilogue_fusion", "max_autotune", "fallback_random", "shape_padding",
                 "triton.cudagraphs", "trace.enabled", "trace.graph_diagram"):
        assert name in opts
    kiln.compile(add_one, options={"fallback_random": True})  # known option: accepted


def test_config_patch_context_and_decorator():
    assert kiln.config.cache_size_limit == 64
    with kiln.config.patch(cache_size_limit=2):
        assert kiln.config.cache_size_limit == 2
    assert kiln.config.cache_size_limit == 64

    @kiln.config.patch("suppress_errors", True)
    def inside():
        return kiln.config.suppress_errors
    assert inside() is True and kiln.config.suppress_errors is False
    with pytest.raises(AttributeError, match="no setting 'nope'"):
        kiln.config.patch(nope=1)
    with pytest.raises(AttributeError):
        kiln.config.nope = 3


def test_disable_runs_eagerly_and_keeps_name():
    calls = []

    @kiln.disable
    def side(x):
        calls.append(1)
        return x + 1

    assert side.__name__ == "side"
    torch.testing.assert_close(side(torch.zeros(2)), torch.ones(2))
    assert calls == [1]


def test_reset_is_callable_and_compiled_still_correct():
    f = kiln.compile(add_one, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x + 1)
    kiln.reset()
    torch.testing.assert_close(f(x), x + 1)


def test_python_outside_the_supported_set_warns_and_runs_eagerly(monkeypatch):
    import kiln.api
    config_mod = kiln.api.config_mod  # the module (kiln.config is the settings object)
    monkeypatch.setattr(config_mod, "SUPPORTED_PYTHONS", ((3, 8), (3, 9)))  # as if this Python were 3.14
    monkeypatch.setattr(kiln.api, "_warned_python", False)

    def fn(x):
        return x + 1
    with pytest.warns(RuntimeWarning, match=r"kiln captures CPython 3\.8 and 3\.9 bytecode; this is Python "
                                            r".*, so compiled code runs eagerly"):
        compiled = kiln.compile(fn)
    assert compiled is fn
    with kiln.config.patch(error_on_unsupported_python=True), pytest.raises(RuntimeError, match="runs eagerly"):
        kiln.compile(fn)


def test_supported_pythons_include_this_one():
    import kiln.api
    config_mod = kiln.api.config_mod
    assert config_mod.python_supported()
    assert config_mod.supported_pythons_text() == "3.11, 3.12 and 3.13"


@pytest.mark.parametrize("mode, options, named", [
    ("max-autotune", None, {"max_autotune", "coordinate_descent_tuning", "triton.cudagraphs"}),
    ("reduce-overhead", None, {"triton.cudagraphs"}),
    (None, {"shape_padding": True, "trace.graph_diagram": True}, {"shape_padding"}),
    (None, None, set()),
])
def test_options_without_effect_on_cpu_say_so(monkeypatch, mode, options, named):
    """An accepted option that changes nothing on CPU is named in a perf_hints line with its reason,
    never silently ignored; the program still runs as eager does."""
    import kiln.compiler as compiler
    hints = []
    monkeypatch.setattr(compiler, "log", lambda artifact, msg, *args: hints.append((artifact, msg % args)))
    x = torch.randn(4, 3)
    out = kiln.compile(lambda t: torch.relu(t) * 2, mode=mode, options=options)(x)
    torch.testing.assert_close(out, torch.relu(x) * 2)
    said = {m.split()[1] for a, m in hints if a == "perf_hints" and m.startswith("option ")}
    assert said == named
