"""A frame that runs eagerly still has its callees compiled, and still behaves exactly as it would
uncompiled (exceptions, tracebacks, generators, closures, super(), locals(), recursion, calls of
every shape).

Each test makes an outer frame run eagerly (a break inside a loop, inside a with-block, a generator,
a raising call, the cache-size limit, an internal error) and checks that a callee's work reached the
backend, that results and after-call state equal eager's, and that nothing else changed."""
import contextlib
import sys
import traceback
import warnings

import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_equal_state, check_calls, clone_args

EVENTS = []


@kiln.disable
def note(value):
    """A call capture cannot put in a graph: inside a loop it makes the whole frame run eagerly."""
    EVENTS.append(value)


def work(x):
    """The callee whose work must be compiled: its tanh is in a graph when it is."""
    return torch.tanh(x) * 3 + 1


def compiled_ops(counter):
    return {getattr(n.target, "__name__", str(n.target)) for g in counter.graphs for n in g.graph.nodes
            if n.op.startswith("call")}


def run_both(fn, *args, backend=None, **compile_kwargs):
    """fn eagerly and compiled on equal copies of args: results, args afterwards and EVENTS must match.
    Returns the counting backend."""
    counter = backend or CompileCounter()
    compiled = kiln.compile(fn, backend=counter, **compile_kwargs)
    eager_args, compiled_args = clone_args(args), clone_args(args)
    EVENTS.clear()
    expected = fn(*eager_args)
    eager_events = list(EVENTS)
    EVENTS.clear()
    actual = compiled(*compiled_args)
    assert_equal_state(actual, expected)
    assert_equal_state(compiled_args, eager_args)
    assert_equal_state(EVENTS, eager_events)
    return counter


# ---- every way a frame ends up eager --------------------------------------------------------------
def test_break_inside_loop():
    def f(x):
        for i in range(3):
            x = work(x) + i
            note(i)
        return x
    counter = run_both(f, torch.randn(4))
    assert "tanh" in compiled_ops(counter)


def test_break_inside_with_block():
    class Tracking:
        def __enter__(self):
            EVENTS.append("enter")

        def __exit__(self, *exc):
            EVENTS.append("exit")

    def f(x):
        with Tracking():
            y = work(x)
            note("inside")
            y = work(y)
        return y
    counter = run_both(f, torch.randn(4))
    assert "tanh" in compiled_ops(counter)


@pytest.mark.torch_differs("torch.compile's frame hook is off when a generator made in the compiled call "
                             "resumes after it returned; kiln compiles the callees of its rewritten frame")
def test_generator_compiled_directly():
    def layers(x, n):
        for i in range(n):
            x = work(x)
            note(i)
            yield x
    counter = CompileCounter()
    compiled = kiln.compile(layers, backend=counter)
    x = torch.randn(4)
    EVENTS.clear()
    expected = list(layers(x, 3))
    assert_equal_state(list(compiled(x, 3)), expected)
    assert EVENTS == [0, 1, 2] * 2
    assert "tanh" in compiled_ops(counter)


def test_call_that_raises():
    def f(x, limit):
        y = work(x)
        if limit < 0:
            raise ValueError(f"limit must be positive, got {limit}")
        return y * limit
    counter = check_calls(f, [(torch.randn(4), -1), (torch.randn(4), -2)])
    assert "tanh" in compiled_ops(counter)


@pytest.mark.torch_differs("past the recompile limit torch.compile runs the frame's callees from their caches "
                           "only, compiling nothing new; kiln compiles them (each under its own limit)")
def test_cache_size_limit():
    def f(x, n):
        return work(x) + n
    with kiln.config.patch(cache_size_limit=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kiln warns when a frame hits the limit
        counter = check_calls(f, [(torch.randn(4), n) for n in range(4)], dynamic=False)
    assert counter.frame_count == 2  # f for n=0, then work as a frame of its own for every other n


@pytest.mark.kiln_only
def test_internal_error_during_capture(monkeypatch):
    from kiln.capture import convert
    real = convert._compile_frame

    def failing(F, L, code, *args):
        if code.co_name == "outer":
            raise KeyError("a bug in capture")
        return real(F, L, code, *args)
    monkeypatch.setattr(convert, "_compile_frame", failing)

    def outer(x):
        return work(x) * 2
    counter = run_both(outer, torch.randn(4))
    assert "tanh" in compiled_ops(counter)


# ---- what a skipped frame calls -------------------------------------------------------------------
class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return torch.sigmoid(x) * self.k

    def __call__(self, x):
        return torch.tanh(x) + self.k

    @classmethod
    def make(cls, k):
        return cls(k)

    @staticmethod
    def shift(x):
        return torch.cos(x) - 1


def test_methods_callable_objects_class_and_static_methods():
    def f(x):
        s = Scaler.make(2.0)
        for i in range(2):
            x = s.apply(x) + s(x) + Scaler.shift(x)
            note(i)
        return x
    counter = run_both(f, torch.randn(4))
    assert {"sigmoid", "tanh", "cos"} <= compiled_ops(counter)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, scale=1.0):
        return torch.tanh(self.lin(x)) * scale


class Stack(torch.nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(n)])
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x, scale=0.5)
            note(i)
        self.calls += 1
        return x


def test_module_forwards_compile_and_buffers_update():
    torch.manual_seed(0)
    model = Stack()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(2, 6)
    expected = model(x)
    torch.testing.assert_close(compiled(x), expected)
    assert model.calls.item() == 2
    assert "tanh" in compiled_ops(counter)


def test_module_hooks_run_and_forward_compiles():
    torch.manual_seed(0)
    model = Stack()
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    model.blocks[1].register_forward_hook(lambda mod, args, out: seen.append(out.shape) or out + 1)
    model.blocks[2].register_forward_pre_hook(lambda mod, args, kwargs: (args, {"scale": 3.0}), with_kwargs=True)
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(2, 6)
    expected = model(x)
    eager_seen = list(seen)
    seen.clear()
    torch.testing.assert_close(compiled(x), expected)
    assert seen == eager_seen
    assert "tanh" in compiled_ops(counter)


def test_lambdas_nested_functions_and_comprehensions():
    def f(x):
        double = lambda t: work(t) * 2  # noqa: E731

        def add_sin(t):
            return torch.sin(t) + x.sum()
        for i in range(2):
            x = sum([double(t) for t in x.unbind(0)]) + add_sin(x)
            note(i)
        return x
    counter = run_both(f, torch.randn(3, 4))
    assert {"tanh", "sin"} <= compiled_ops(counter)


def test_generator_callee_defined_in_user_code():
    def scaled(xs):
        for t in xs:
            yield work(t)

    def f(x):
        out = []
        for i, y in enumerate(scaled(x.unbind(0))):
            out.append(y)
            note(i)
        return torch.stack(out)
    counter = run_both(f, torch.randn(3, 4))
    assert "tanh" in compiled_ops(counter)


@pytest.mark.kiln_only
def test_library_code_runs_natively():
    lin = torch.nn.Linear(4, 4)
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def f(x):
        for i in range(2):
            x = torch.nn.functional.gelu(seq(lin(x)))
            x = work(x)
            note(i)
        return x
    counter = run_both(f, torch.randn(2, 4))
    assert counter.frame_count == 1  # work's graph only: torch's modules and functions are not frames
    assert compiled_ops(counter) == {"tanh", "mul", "add"}


def test_llama_like_decoder_loop_compiles_its_layers():
    """A decoder whose layer loop holds a break: the model's own frame runs eagerly, its layers compile."""
    class RMSNorm(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Attention(torch.nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.qkv, self.out = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d, bias=False)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
            att = torch.softmax((q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) / (d // self.heads) ** 0.5, -1)
            return self.out((att @ v.transpose(1, 2)).transpose(1, 2).reshape(b, s, d))

    class DecoderLayer(torch.nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.norm1, self.attn, self.norm2 = RMSNorm(d), Attention(d, heads), RMSNorm(d)
            self.up, self.down = torch.nn.Linear(d, 2 * d, bias=False), torch.nn.Linear(2 * d, d, bias=False)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.down(torch.nn.functional.silu(self.up(self.norm2(x))))

    class Decoder(torch.nn.Module):
        def __init__(self, vocab=32, d=16, heads=2, n=3):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, d)
            self.layers = torch.nn.ModuleList([DecoderLayer(d, heads) for _ in range(n)])
            self.norm, self.head = RMSNorm(d), torch.nn.Linear(d, vocab, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            hidden = []
            for layer in self.layers:
                x = layer(x)
                note(len(hidden))  # the break that makes this frame eager
                hidden.append(x)
            return self.head(self.norm(x)), hidden

    torch.manual_seed(0)
    model = Decoder()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    ids = torch.randint(0, 32, (2, 5))
    EVENTS.clear()
    expected = model(ids)
    EVENTS.clear()
    assert_equal_state(compiled(ids), expected)
    assert EVENTS == [0, 1, 2]
    assert {"softmax", "silu", "rsqrt"} <= compiled_ops(counter)


# ---- the skipped frame itself behaves exactly as uncompiled ----------------------------------------
def _frames_in_this_file(tb):
    return [(f.name, f.lineno) for f in traceback.extract_tb(tb) if f.filename == __file__]


def test_exception_and_traceback_from_native_call():
    def f(x, text):
        for i in range(2):
            x = work(x)
            note(i)
        return x * int(text)

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    errors = []
    for fn in (f, compiled):
        with pytest.raises(ValueError) as info:
            fn(torch.randn(3), "not a number")
        errors.append(info)
    assert str(errors[0].value) == str(errors[1].value)
    assert _frames_in_this_file(errors[0].tb)[-1] == _frames_in_this_file(errors[1].tb)[-1]
    assert "tanh" in compiled_ops(counter)


def test_exception_raised_in_callee_is_handled_in_skipped_frame():
    def fragile(x, i):
        if i == 1:
            raise KeyError(i)
        return work(x)

    def f(x):
        done = []
        for i in range(3):
            try:
                x = fragile(x, i)
            except KeyError as e:
                done.append(("caught", e.args))
            else:
                done.append("ok")
            finally:
                note(i)
        return x, done
    counter = run_both(f, torch.randn(4))
    assert "tanh" in compiled_ops(counter)


def test_closure_cells_and_nonlocal():
    def f(x):
        total = x * 0
        count = 0

        def accumulate(t):
            nonlocal total, count
            total = total + work(t)
            count += 1
        for i, row in enumerate(x.unbind(0)):
            accumulate(row)
            note(count)
        return total, count
    counter = run_both(f, torch.randn(3, 4))
    assert "tanh" in compiled_ops(counter)


class Base(torch.nn.Module):
    def forward(self, x):
        return work(x)


class Derived(Base):
    def forward(self, x):
        for i in range(2):
            x = super().forward(x) + i
            note(i)
        return x


def test_super_without_arguments():
    model = Derived()
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), model(x))
    assert "tanh" in compiled_ops(counter)


def test_locals_and_frame_introspection():
    def f(x, tag="t"):
        seen = []
        for i in range(2):
            y = work(x)
            seen.append((sorted(locals()), sys._getframe().f_code.co_name, sys._getframe().f_code.co_qualname))
            note(i)
        return y, seen
    counter = run_both(f, torch.randn(4))
    assert "tanh" in compiled_ops(counter)


def countdown(x, n):
    for i in range(1):
        note(n)
    if n == 0:
        return x
    return countdown(work(x), n - 1)


def test_recursion():
    counter = run_both(countdown, torch.randn(4), 3)
    assert "tanh" in compiled_ops(counter)


def takes_everything(a, b=2, *rest, c, d=4, **extra):
    return work(a) * b + sum(rest) + c * d + sum(extra.values())


def test_keyword_star_args_and_defaults():
    def f(x, k=1.5, *, m=2):
        args, kwargs = (3, 4), {"c": 1, "z": 5}
        out = []
        for i in range(2):
            out.append(takes_everything(x, c=k))
            out.append(takes_everything(x, 1, 2, 3, c=k, d=m, e=6))
            out.append(takes_everything(x, *args, **kwargs))
            out.append(takes_everything(*[x], **{"c": 2}))
            note(i)
        return out
    counter = run_both(f, torch.randn(4))
    assert "tanh" in compiled_ops(counter)


def test_changed_defaults_of_skipped_frame():
    def f(x, k=1.0):
        for i in range(2):
            x = work(x) * k
            note(i)
        return x
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), f(x))
    f.__defaults__ = (3.0,)
    torch.testing.assert_close(compiled(x), f(x))
    assert "tanh" in compiled_ops(counter)


# compiled from a string: pytest rewrites the asserts of this file, and this one must stay as CPython compiles it
METHOD_FORMS = '''
def method_forms(x):
    result = []
    for i in range(2):
        @tag
        def inner(t):
            "inner's docstring"
            return work(t)
        with Closing():
            result.append(inner(x))
        try:
            assert i > 5, work
        except AssertionError as e:
            result.append(e.args[0] is work)
        result.append((inner.tagged, inner.__doc__, inner.__name__))
        note(i)
    return result
'''


def tag(fn):
    fn.tagged = True
    return fn


class Closing(contextlib.AbstractContextManager):
    def __exit__(self, *exc):
        EVENTS.append("closed")


def test_compiler_method_form_calls_untouched():
    """with-block exits, assert messages and decorators call the value below a non-NULL slot: they must
    keep calling exactly what they called."""
    namespace = dict(globals())
    exec(compile(METHOD_FORMS, "<method forms>", "exec"), namespace)
    counter = run_both(namespace["method_forms"], torch.randn(4))
    assert "tanh" in compiled_ops(counter)


def test_class_defined_in_skipped_frame_uses_super():
    def f(x):
        out = []
        for i in range(2):
            class Local(Base):
                def forward(self, t):
                    return super().forward(t) * 2
            out.append(Local()(x))
            note(i)
        return out
    counter = run_both(f, torch.randn(4))
    assert "tanh" in compiled_ops(counter)


def test_function_made_in_skipped_frame_compiles_later():
    """A function a skipped frame makes is the same function as one made by a plain call: it compiles
    once, into one cache, for both."""
    def make(x):
        for i in range(1):
            note(i)

        def later(t):
            return work(t) + x
        return later

    counter = CompileCounter()
    made_skipped, made_plainly = kiln.compile(make, backend=counter)(torch.ones(4)), make(torch.ones(4))
    assert made_skipped.__name__ == made_plainly.__name__ == "later"
    x = torch.randn(4)
    for later in (made_skipped, made_plainly):
        torch.testing.assert_close(kiln.compile(later, backend=counter)(x), work(x) + 1)
    assert counter.frame_count == 1


@pytest.mark.torch_differs("torch.compile's frame hook is off when a generator made in the compiled call "
                             "resumes after it returned; kiln compiles the callees of its rewritten frame")
def test_skipped_generator_send_throw_close():
    def echo(x):
        got = []
        try:
            while True:
                value = yield work(x)
                got.append(value)
                note(value)
        except GeneratorExit:
            EVENTS.append(("closed", got))
            raise
        except KeyError as e:
            yield ("thrown", e.args)

    def drive(make, x):
        gen = make(x)
        out = [next(gen), gen.send(1), gen.send(2), gen.throw(KeyError("k"))]
        gen2 = make(x)
        next(gen2)
        gen2.close()
        return out

    x = torch.randn(3)
    EVENTS.clear()
    expected = drive(echo, x)
    eager_events = list(EVENTS)
    EVENTS.clear()
    counter = CompileCounter()
    actual = drive(kiln.compile(echo, backend=counter), x)
    assert_equal_state(actual, expected)
    assert_equal_state(EVENTS, eager_events)
    assert "tanh" in compiled_ops(counter)


@pytest.mark.kiln_only
def test_logs_say_frame_is_eager_and_callees_compile(kiln_logs, caplog):
    def eager_outer(x):
        for i in range(2):
            x = work(x)
            note(i)
        return x
    kiln_logs("graph_breaks")
    with caplog.at_level("DEBUG", logger="kiln"):
        kiln.compile(eager_outer, backend=CompileCounter())(torch.randn(3))
    assert "frame runs eagerly: the break is inside a loop" in caplog.text
    assert "eager_outer" in caplog.text and "the functions and modules it calls are still compiled" in caplog.text


def test_hf_llama_layers_compile():
    """Hugging Face Llama: whether or not LlamaModel.forward runs eagerly (a break inside its decoder loop
    did that), its decoder layers' work reaches the backend, and the logits equal eager's."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 7))
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter)
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(compiled(ids).logits, expected)
    assert {"silu", "rsqrt"} <= compiled_ops(counter)


# ---- what a frame that runs eagerly sees ------------------------------------------------------------
def _library_helper(name, source):
    """A function of a module that imports torch only inside its functions (as Hugging Face's
    `is_torchdynamo_compiling` does): its globals name no torch."""
    namespace = {}
    exec(compile(source, f"<library {name}>", "exec"), namespace)
    return namespace[name]


is_being_compiled = _library_helper("is_being_compiled", """
def is_being_compiled():
    try:
        import torch
        return torch.compiler.is_compiling()
    except Exception:
        return False
""")


def blocks_of(mask):
    return mask.reshape(mask.shape[0], -1, 2)


def stack_forward(x, mask=None):
    """Leaves the mask None under compilation (a compiled model makes its own): this frame raises
    in the trace only, so it runs eagerly, where the helper must answer False as in eager."""
    if mask is None and not is_being_compiled():
        mask = torch.ones(x.shape)
    return x * blocks_of(mask).reshape(x.shape)


def model_forward(x):
    return stack_forward(x.sin()) * 2


def test_a_helper_without_tensors_runs_natively_when_an_eager_frame_calls_it():
    run_both(model_forward, torch.randn(2, 4))


def test_a_frame_whose_trace_raises_runs_eagerly_instead_of_raising():
    def model(x):
        if x.shape[0] > 0 and not torch.compiler.is_compiling():
            mask = torch.ones(x.shape)
        else:
            mask = None
        return work(x) * blocks_of(mask).reshape(x.shape)
    counter = run_both(model, torch.randn(2, 4))
    assert "tanh" in compiled_ops(counter)  # the callee still compiles
