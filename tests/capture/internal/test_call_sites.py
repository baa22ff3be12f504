"""call_sites.rewrite_calls: which calls go through `resolve`, and that everything else is kept."""
import importlib
import types

import pytest
import torch

from kiln.capture.call_sites import CannotRewrite, original_code, rewrite_calls


def rewritten(fn, resolve):
    code = rewrite_calls(fn.__code__, resolve)
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


class Recorder:
    """A resolve that records what it was asked about and returns it unchanged."""

    def __init__(self):
        self.seen = []

    def __call__(self, f):
        self.seen.append(f)
        return f


def plain(x, obj, items, kw):
    a = abs(x)                       # a global builtin
    b = obj.scale(a, k=2)            # a method call with a keyword
    c = max(*items, **kw)            # CALL_FUNCTION_EX with both
    d = [abs(i) for i in items]      # a call inside a comprehension (its own code object)
    return a, b, c, d


class Scaler:
    def scale(self, a, k):
        return a * k


def test_every_plain_call_goes_through_resolve_once():
    rec = Recorder()
    args = (-3, Scaler(), [1, -5], {"key": abs})
    assert rewritten(plain, rec)(*args) == plain(*args)
    names = [getattr(f, "__name__", f) for f in rec.seen]
    assert names == ["abs", "scale", "max", "abs", "abs"]


METHOD_FORMS = """
def method_forms(x, cm, msg):
    def decorate(fn):
        fn.decorated = True
        return fn

    @decorate
    def inner():
        return x
    with cm:
        pass
    try:
        assert x < 0, msg
    except AssertionError as e:
        return e.args[0], inner.decorated
    return None
"""
exec(compile(METHOD_FORMS, "<method forms>", "exec"))  # not this file: pytest rewrites its asserts


class CM:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def a_message():
    """An assert message that is itself callable."""


def test_method_form_calls_do_not_go_through_resolve():
    """A with-block's exit, an assert's message and a decorator's function sit above a non-NULL slot:
    they are not the callable, so resolve must never see them (a stand-in would replace them)."""
    rec = Recorder()
    assert rewritten(method_forms, rec)(1, CM(), a_message) == (a_message, True)  # noqa: F821
    assert a_message not in rec.seen
    assert not any(getattr(f, "__name__", "") in ("inner", "decorate", "__exit__") for f in rec.seen)


def test_copy_keeps_what_the_frame_sees():
    def f(a, b=1, *rest, c, **kw):
        """doc"""
        z = a + b

        def g():
            return z
        return g

    code = rewrite_calls(f.__code__, lambda fn: fn)
    for attr in ("co_name", "co_qualname", "co_filename", "co_firstlineno", "co_argcount", "co_kwonlyargcount",
                 "co_posonlyargcount", "co_varnames", "co_cellvars", "co_freevars", "co_flags", "co_names"):
        assert getattr(code, attr) == getattr(f.__code__, attr), attr
    assert code.co_consts[0] == "doc"
    assert original_code(code) is f.__code__
    nested = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    assert original_code(nested) is next(c for c in f.__code__.co_consts if isinstance(c, types.CodeType))
    assert original_code(f.__code__) is f.__code__


def test_line_numbers_of_the_original_instructions_are_kept():
    def f(x):
        y = abs(x)
        return int("not a number") + y

    with pytest.raises(ValueError) as original:
        f(1)
    with pytest.raises(ValueError) as copy:
        rewritten(f, lambda fn: fn)(1)
    assert original.traceback[-1].lineno == copy.traceback[-1].lineno


@pytest.mark.parametrize("module", ["torch.nn.modules.module", "torch.nn.functional", "json.decoder",
                                    "collections", "dataclasses", "argparse",
                                    "transformers.models.llama.modeling_llama"])
def test_real_code_rewrites(module):
    """Every function of a few large modules (torch, the standard library, Hugging Face) rewrites: a
    layout the version table does not know would raise CannotRewrite here first."""
    mod = pytest.importorskip(module) if module.startswith("transformers") else importlib.import_module(module)
    count = 0
    for value in list(vars(mod).values()) + [v for cls in vars(mod).values() if isinstance(cls, type)
                                             and cls.__module__ == module for v in vars(cls).values()]:
        value = getattr(value, "__func__", value)
        if isinstance(value, types.FunctionType) and value.__module__ == module:
            try:
                rewrite_calls(value.__code__, lambda fn: fn)
            except CannotRewrite as e:  # pragma: no cover - the failure message names the function
                pytest.fail(f"{value.__qualname__}: {e}")
            count += 1
    assert count > 5


def test_module_call_impl_copy_runs_hooks():
    calls = []
    lin = torch.nn.Linear(2, 2)
    lin.register_forward_hook(lambda mod, args, out: calls.append("hook") or out * 0)
    rec = Recorder()
    call_impl = rewritten(torch.nn.Module._call_impl, rec)
    out = call_impl(lin, torch.ones(2))
    assert calls == ["hook"] and torch.equal(out, torch.zeros(2))
    assert any(getattr(f, "__func__", None) is torch.nn.Linear.forward for f in rec.seen)


class Base:
    def hello(self, n, *rest, k=0):
        return ("base", n, rest, k)


class Derived(Base):
    def shapes(self, items, kw):
        """Call layouts that differ between CPython versions, each a plain call `resolve` must see."""
        a = super().hello(1, k=2)                  # 3.12+: LOAD_SUPER_ATTR with its method bit
        bound = super().hello                      # ... and without it (an attribute, not a call)
        b = super(Derived, self).hello(*items)     # two-argument super, CALL_FUNCTION_EX
        c = self.hello(*items, 3)                  # CALL_INTRINSIC_1 (list to tuple), then CALL_FUNCTION_EX
        d = self.hello(4, **kw)                    # a method with **kwargs
        e = sorted([abs(i) for i in items], key=abs, reverse=True)  # 3.12+: an inlined comprehension
        try:
            f = int("x")                           # a call that raises inside a try (exception table)
        except ValueError as err:
            f = str(err).upper().lower()           # chained method calls
        g = (lambda v: abs(v))(-5)                 # a lambda called where it is made
        cell = 7
        h = [(lambda: cell + i)() for i in range(2)]  # a comprehension over a cell variable
        return a, bound(5), b, c, d, e, f, g, h


def test_call_layouts_of_every_version():
    """Every call in `shapes` goes through resolve once, in order, and the copy computes the same."""
    rec = Recorder()
    obj, items, kw = Derived(), [-1, 2], {"k": 9}
    assert rewritten(Derived.shapes, rec)(obj, items, kw) == obj.shapes(items, kw)
    # super() is a call on 3.11 only (3.12+ reads `super().name` with LOAD_SUPER_ATTR)
    names = [getattr(f, "__name__", f) for f in rec.seen if f is not super]
    assert names == ["hello", "hello", "hello", "hello", "abs", "abs", "sorted", "int", "str", "upper", "lower",
                     "<lambda>", "abs", "range", "<lambda>", "<lambda>", "hello"]
    assert all(f.__self__ is obj for f in rec.seen if getattr(f, "__name__", "") == "hello")
