"""Calls inside the region: user functions inlined, *args/**kwargs and defaults, closures/cells,
nonlocal, globals, builtins, math and operator functions. One graph each, eager results."""
import functools
import math
import operator

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs

SCALE = 3.0
OFFSETS = [1.0, 2.0]
CONFIG = {"act": "relu", "depth": 2}


def helper_add(a, b=1, *, c=2):
    return a + b + c


def helper_varargs(*args, **kwargs):
    out = sum(args)
    for k in sorted(kwargs):
        out = out * kwargs[k]
    return out


def helper_recursive(x, n):
    return x if n == 0 else helper_recursive(x * 2, n - 1)


def calls_user_function(x):
    return helper_add(x) + helper_add(x, 5, c=1)


def calls_varargs(x):
    return helper_varargs(x, x + 1, x * 2, alpha=2, beta=0.5)


def calls_star_forwarding(x):
    args, kw = (x, 2), {"c": 4}
    return helper_add(*args, **kw)


def calls_recursive(x):
    return helper_recursive(x, 3)


def calls_partial(x):
    add10 = functools.partial(helper_add, b=10)
    return add10(x)


def reads_globals(x):
    return x * SCALE + OFFSETS[1] + CONFIG["depth"]


def global_dispatch_by_name(x):
    return torch.relu(x) if CONFIG["act"] == "relu" else torch.tanh(x)


def closure_reads_cell(x):
    k = 4

    def inner(t):
        return t * k

    return inner(x)


def closure_nonlocal_counter(x):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t + count

    x = bump(x)
    x = bump(x)
    return x * count


def closure_nested_two_levels(x):
    a = 2

    def outer(t):
        b = 3

        def inner(u):
            return u * a + b

        return inner(t)

    return outer(x)


def closure_captures_tensor(x):
    w = x.cos()

    def apply(t):
        return t * w

    return apply(x.sin())


def make_scaler(k):
    def scale(t):
        return t * k
    return scale


def closure_factory_inside(x):
    return make_scaler(5)(x) + make_scaler(0.5)(x)


def builtin_functions(x):
    vals = [3, 1, 2]
    return x * (len(vals) + max(vals) + min(vals) + sum(vals) + abs(-2) + pow(2, 3) + divmod(7, 2)[1])


def builtin_isinstance_type(x, y):
    out = x
    if isinstance(y, torch.Tensor):
        out = out + y
    if isinstance(3, (int, float)) and type(2.0) is float and not isinstance(x, (list, dict)):
        out = out * 2
    if type(x) is torch.Tensor:
        out = out - 1
    return out


def builtin_getattr_hasattr(x):
    n = getattr(x, "ndim")
    f = getattr(torch, "relu")
    if hasattr(x, "shape") and not hasattr(x, "definitely_not_there"):
        return f(x) * n
    return x


def builtin_all_any_zip_map(x):
    sizes = list(map(lambda s: s * 2, x.shape))
    if all(s > 0 for s in sizes) and any(s == 6 for s in sizes):
        return x + sum(a * b for a, b in zip(sizes, [1, 2]))
    return x


def builtin_callable_id_check(x):
    if callable(torch.sin) and not callable(3):
        return torch.sin(x)
    return x


def math_functions(x):
    c = math.sqrt(16) + math.log(math.e) + math.floor(2.7) + math.ceil(0.1) + math.pi / math.pi
    return x * c + math.cos(0.0) + math.prod([2, 3]) + math.isclose(1.0, 1.0)


def math_on_shape(x):
    d = x.shape[-1]
    return x / math.sqrt(d)


def operator_functions(x):
    y = operator.add(x, 1)
    y = operator.mul(y, 2)
    y = operator.neg(y)
    y = operator.getitem([y, x], 0)
    return functools.reduce(operator.add, [y, x, x]), operator.itemgetter(1)([1, 5]) * x


def operator_attrgetter(x):
    return x * operator.attrgetter("ndim")(x)


def lambda_passed_to_helper(x):
    def apply_twice(f, t):
        return f(f(t))
    return apply_twice(lambda t: t * 2 + 1, x)


def default_from_global(x, scale=SCALE):
    return x * scale


CASES = [calls_user_function, calls_varargs, calls_star_forwarding, calls_recursive, calls_partial,
         reads_globals, global_dispatch_by_name, closure_reads_cell, closure_nonlocal_counter,
         closure_nested_two_levels, closure_captures_tensor, closure_factory_inside, builtin_functions,
         builtin_getattr_hasattr, builtin_all_any_zip_map, builtin_callable_id_check, math_functions,
         math_on_shape, operator_functions, operator_attrgetter, lambda_passed_to_helper, default_from_global]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_calls_one_graph(fn):
    check_graphs(fn, torch.randn(2, 3), graphs=1)


def test_isinstance_and_type_one_graph():
    check_graphs(builtin_isinstance_type, torch.randn(3), torch.randn(3), graphs=1)


def test_compiled_closure_reads_outer_tensor():
    w = torch.randn(3)

    def f(x):
        return x * w + 1
    check_graphs(f, torch.randn(3), graphs=1)


def test_kwargs_at_the_call_site():
    def f(x, *, alpha=1.0, beta=None):
        return x * alpha + (0 if beta is None else beta)
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, alpha=2.0, beta=x), f(x, alpha=2.0, beta=x))
    assert counter.frame_count == 1


def test_compiled_function_calls_another_compiled_function():
    counter = CompileCounter()
    inner = kiln.compile(lambda t: t.sin() + 1, backend=counter)

    def outer(x):
        return inner(x) * 2
    compiled = kiln.compile(outer, backend=counter)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), (x.sin() + 1) * 2)
    assert counter.frame_count == 1


def deep_recursion(x, n):
    return x if n == 0 else deep_recursion(x + 1, n - 1)


def test_deep_recursion_inlined():
    check_graphs(deep_recursion, torch.zeros(2), 30, graphs=1)
