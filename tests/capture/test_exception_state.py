"""`sys.exc_info()` / `sys.exception()` in a compiled frame: the exception the frame (or a frame it
called) is handling, none once handled, and the caller's when the compiled function is called from
inside an `except` block. Each runs eagerly and compiled."""
import sys

import pytest
import torch

import kiln
from tests.utils import check_graphs


def t(*shape):
    return torch.randn(*shape)


def handled_then_done(x):
    try:
        try:
            raise ZeroDivisionError("z")
        except ZeroDivisionError:
            for exc in (KeyError, IndexError):
                try:
                    raise exc
                except exc:
                    pass
            during = sys.exc_info()  # back to the ZeroDivisionError once the inner handlers end
            raise
    except ZeroDivisionError:
        pass
    after = sys.exc_info()
    return x + 1, during[0], during[1].args, during[2] is not None, after


def handled_in_callee(x):
    def current():
        return sys.exc_info()[0]

    try:
        raise KeyError("k")
    except KeyError:
        inside = current()  # a callee sees its caller's exception
    return x * 2, inside, current()


@pytest.mark.parametrize("fn", [handled_then_done, handled_in_callee])
def test_exc_info_names_the_exception_being_handled_in_one_graph(fn):
    # (before: sys.exc_info was "not Python code kiln can follow", a graph break)
    check_graphs(fn, t(2), graphs=1, fullgraph=True)


@pytest.mark.skipif(not hasattr(sys, "exception"), reason="sys.exception() is 3.11+")
def test_sys_exception_likewise():
    def fn(x):
        try:
            raise ValueError("v")
        except ValueError:
            inside = sys.exception()
        return x + 1, inside.args, sys.exception()

    check_graphs(fn, t(2), graphs=1, fullgraph=True)


@pytest.mark.torch_differs("torch.compile 2.13 answers None: the caller's exception is not guarded")
def test_called_from_an_except_block_the_callers_exception_shows():
    def fn(x):
        return x + 1, sys.exc_info()[0]

    compiled = kiln.compile(fn, backend="eager")
    x = t(2)
    assert compiled(x)[1] is None
    try:
        raise LookupError("outer")
    except LookupError:
        want, got = fn(x), compiled(x)  # (a guard: the first entry assumed no caller exception)
    assert got[1] is want[1] is LookupError
    torch.testing.assert_close(got[0], want[0])
    assert compiled(x)[1] is None


def context_from_the_callers_handler(x):
    def fails(kind):
        raise kind("inner")  # raised while the caller handles the KeyError: that is its context

    try:
        raise KeyError("outer")
    except KeyError:
        try:
            fails(ValueError)
        except ValueError as e:
            caught = e
    return x + 1, type(caught.__context__).__name__, caught.__context__.args


def test_an_exception_raised_in_a_callee_takes_the_callers_handled_one_as_context():
    # (before: only the raising frame's own handler counted: __context__ stayed None)
    check_graphs(context_from_the_callers_handler, t(2), graphs=1, fullgraph=True)


def bare_raise_in_callee(x):
    def reraise():
        raise  # re-raises what the caller is handling  # noqa: PLE0704

    try:
        try:
            raise KeyError("k")
        except KeyError:
            reraise()
    except KeyError as e:
        again = e.args
    try:
        reraise()  # nothing is being handled any more
    except RuntimeError as e:
        nothing = str(e)
    return x + 1, again, nothing


def test_a_bare_raise_re_raises_what_a_calling_frame_handles_or_fails_as_cpython():
    # (before: only the raising frame's own handler counted; with none, capture stopped)
    check_graphs(bare_raise_in_callee, t(2), graphs=1, fullgraph=True)


class _Fallback:
    def __init__(self):
        self.a = 10

    def __getattr__(self, name):  # capture may run this while handling the lookup's AttributeError
        try:
            raise AttributeError(f"{name} absent")
        except AttributeError:
            return 30


def test_a_raise_in_a_getattr_fallback_is_not_taken_for_the_callers_exception():
    obj = _Fallback()

    def fn(x):
        return x * obj.a * obj.b

    # (an earlier version read the caller's exception state when it was asked, by then inside an
    # except block of capture's own: it refused, a graph break)
    check_graphs(fn, t(2), graphs=1, fullgraph=True)
