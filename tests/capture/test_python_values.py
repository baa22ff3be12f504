"""Python values inside the region: arithmetic, comparisons, containers, unpacking, strings,
comprehensions, lambdas. Each function must be captured as ONE graph and match eager."""
import pytest
import torch

from tests.utils import check_graphs


def arith_int_float(x):
    a, b = 7, 2.5
    return x * (a // 2) + x / b - (a % 3) + (a ** 2) * 0.01 - (-a) + abs(-b)


def arith_tensor_ops(x, y):
    return (x + y) * (x - y) / (y.abs() + 1) + x ** 2 - y % 3 + (x // 1.5)


def arith_reflected(x):
    return 1 - x, 2 / (x.abs() + 1), 3 ** x.clamp(-2, 2), 5 + x


def arith_bitwise(x):
    i = (x * 10).to(torch.int64)
    return i & 3, i | 4, i ^ 5, ~i, i << 1, i >> 1


def arith_matmul_operator(x, w):
    return x @ w


def compare_python(x):
    a, b = 3, 4.0
    flags = (a < b, a <= b, a == 3, a != b, b > a, b >= 4.0, a is not None, 3 in (1, 2, 3))
    return x + sum(flags)


def compare_tensors(x, y):
    return x < y, x <= y, x == y, x != y, x > y, x >= y


def chained_compare_python(x):
    n = 5
    return x + 1 if 0 < n < 10 else x - 1


def bool_ops_python(x):
    a, b = True, False
    v = (a and not b) or b
    return x * 2 if v else x


def tuple_ops(x):
    t = (x, x + 1, x + 2)
    u = t + (x * 3,)
    return u[1:], len(u), u[-1], u[0] * 2, (1, 2) * 2, (4, 5).index(5)


def list_methods(x):
    out = [x]
    out.append(x + 1)
    out.extend([x + 2, x + 3])
    out.insert(0, x - 1)
    last = out.pop()
    out.reverse()
    return out, last, len(out)


def list_index_assign(x):
    lst = [x, x * 2, x * 3, x * 4]
    lst[1] = lst[1] + 10
    lst[2:4] = [x, x]
    del lst[0]
    return lst


def list_sort_python(x):
    nums = [3, 1, 2]
    nums.sort()
    r = sorted([5, 4, 6], reverse=True)
    return x * nums[0] + r[0]


def dict_methods(x):
    d = {"a": x, "b": x + 1}
    d["c"] = x * 2
    d.update({"d": x - 1})
    v = d.pop("a")
    g = d.get("missing", x * 0)
    s = d.setdefault("e", x + 5)
    return v + g + s, list(d.keys()), [d[k] for k in d], "b" in d


def dict_iteration(x):
    d = {"one": 1, "two": 2, "three": 3}
    out = x
    for k, v in d.items():
        out = out + v * len(k)
    for v in d.values():
        out = out * 1.0 + v
    return out


def dict_comprehension_and_literal_unpack(x):
    base = {"a": x, "b": x * 2}
    d = {**base, "c": x * 3}
    return {k: v + 1 for k, v in d.items() if k != "b"}


def set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    t = s | {7}
    u = s & {2, 3, 9}
    return x * len(t) + len(u) + (3 in s) + len(s - {2})


def frozenset_membership(x):
    allowed = frozenset({"relu", "tanh"})
    return torch.tanh(x) if "tanh" in allowed else x


def unpack_basic(x):
    a, b = x, x + 1
    (c, d), e = (a * 2, b * 2), 3
    return a + b + c + d + e


def unpack_star(x):
    first, *middle, last = [x, x + 1, x + 2, x + 3]
    return first + last + sum(middle)


def unpack_tensor_rows(x):
    a, b, c = x  # iterating a tensor's first dimension
    return a * b + c


def unpack_swap(x, y):
    x, y = y, x
    return x - y


def star_call(x):
    args = (x, 1)
    kwargs = {"alpha": 2}
    return torch.add(*args, **kwargs)


def fstring_and_str_ops(x):
    name = "layer"
    key = f"{name}_{3}:{2.5:.1f}"
    parts = key.split("_")
    joined = "-".join(parts).upper()
    if key.startswith("layer") and joined == "LAYER-3:2.5" and "ye" in key:
        return x + len(key)
    return x


def str_format_methods(x):
    s = "{}-{}".format("a", 1)
    t = "%s/%d" % ("b", 2)
    return x * (len(s) + len(t)) if s.replace("-", "") == "a1" and t.strip() == "b/2" else x


def list_comprehension(x):
    return [x * i for i in range(4) if i != 2]


def nested_comprehension(x):
    return sum([x * i * j for i in range(3) for j in range(2)])


def set_and_generator_expression(x):
    sizes = {d for d in x.shape}
    total = sum(d for d in x.shape)
    return x + total + len(sizes)


def lambda_local(x):
    f = lambda t, k=2: t * k + 1  # noqa: E731
    return f(x), f(x, k=3)


def lambda_sorted_key(x):
    pairs = [("b", 2), ("a", 3), ("c", 1)]
    pairs.sort(key=lambda p: p[1])
    return x * pairs[0][1] + pairs[-1][1]


def slices_python(x):
    seq = list(range(10))
    return x + sum(seq[2:8:2]) + seq[-1] + len(seq[::-1]) + seq[slice(1, 3)][0]


def none_handling(x, bias=None):
    if bias is None:
        bias = x.new_zeros(())
    return x + bias


def conditional_expression(x):
    scale = 2 if x.dim() == 2 else 3
    return x * scale


def walrus_operator(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x


def augmented_assign(x):
    y = x.clone()
    y += 1
    y *= 2
    n = 3
    n += 4
    n //= 2
    return y - n


def multiple_returns_dict(x):
    return {"sum": x.sum(), "max": x.max(), "shape": tuple(x.shape)}


def int_float_conversions(x):
    n = int(3.7) + float("1.5") + round(2.6) + int(True)
    return x * n + bool(x.numel())


def min_max_python(x):
    return x * max(1, 5, 3) + min([4, 2, 8]) + max((1, 9))


def tuple_compare_and_hash(x):
    key = (1, "a")
    table = {(1, "a"): 3, (2, "b"): 4}
    return x * table[key] if key == (1, "a") else x


def string_in_list_dispatch(x):
    acts = {"relu": torch.relu, "sigmoid": torch.sigmoid}
    names = ["relu", "sigmoid"]
    return [acts[n](x) for n in names]


CASES = [
    (arith_int_float, 1), (arith_tensor_ops, 2), (arith_reflected, 1), (arith_bitwise, 1),
    (compare_python, 1), (compare_tensors, 2), (chained_compare_python, 1), (bool_ops_python, 1),
    (tuple_ops, 1), (list_methods, 1), (list_index_assign, 1), (list_sort_python, 1),
    (dict_methods, 1), (dict_iteration, 1), (dict_comprehension_and_literal_unpack, 1), (set_ops, 1),
    (frozenset_membership, 1), (unpack_basic, 1), (unpack_star, 1), (unpack_tensor_rows, 1),
    (unpack_swap, 2), (star_call, 1), (fstring_and_str_ops, 1), (str_format_methods, 1),
    (list_comprehension, 1), (nested_comprehension, 1), (set_and_generator_expression, 1),
    (lambda_local, 1), (lambda_sorted_key, 1), (slices_python, 1), (none_handling, 1),
    (conditional_expression, 1), (walrus_operator, 1), (augmented_assign, 1),
    (multiple_returns_dict, 1), (int_float_conversions, 1), (min_max_python, 1),
    (tuple_compare_and_hash, 1), (string_in_list_dispatch, 1),
]


@pytest.mark.parametrize("fn, n_tensors", CASES, ids=[c[0].__name__ for c in CASES])
def test_python_values_one_graph(fn, n_tensors):
    args = [torch.randn(3, 4) for _ in range(n_tensors)]
    check_graphs(fn, *args, graphs=1)


def test_matmul_operator_one_graph():
    check_graphs(arith_matmul_operator, torch.randn(3, 4), torch.randn(4, 5), graphs=1)


def test_default_argument_given_explicitly():
    check_graphs(none_handling, torch.randn(3), torch.ones(3), graphs=1)


def test_python_scalar_argument_specialized():
    def f(x, n, flag):
        return x * n if flag else x - n
    check_graphs(f, torch.randn(3), 4, True, graphs=1)


def test_container_arguments():
    def f(pair, mapping, tensors):
        a, b = pair
        return a * mapping["scale"] + b + sum(tensors)
    check_graphs(f, (torch.randn(3), torch.randn(3)), {"scale": 2.0}, [torch.randn(3)] * 2, graphs=1)


def test_a_list_that_contains_itself_runs_as_eager():
    """Capture cannot take it in (it would unfold forever): the frame runs natively, no error."""
    import kiln
    from tests.utils import CompileCounter
    nest = []
    nest[:] = [nest, torch.ones(2), None]

    def first_tensor_plus_one(x):
        return nest[0][0][1] + x, nest
    counter = CompileCounter()
    out, same = kiln.compile(first_tensor_plus_one, backend=counter)(torch.ones(2))
    assert same is nest
    torch.testing.assert_close(out, torch.full((2,), 2.0))
