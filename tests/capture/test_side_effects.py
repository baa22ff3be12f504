"""Python state changed inside a single graph (no break): globals rebound, cells written, arguments
and global containers mutated, outputs aliasing inputs. State after the call must be eager's."""
import sys

import pytest
import torch

import kiln
from tests.utils import CompileCounter, assert_equal_state, check_graphs

COUNTER = 0
REGISTRY = {}


def rebinds_global(x):
    global COUNTER
    COUNTER += 1
    return x + COUNTER


def writes_global_dict(x):
    REGISTRY["last"] = x * 2
    REGISTRY.setdefault("calls", 0)
    REGISTRY["calls"] += 1
    return REGISTRY["last"].sum()


def run_twice_compare_module_state(fn, x, names):
    """Run fn eagerly, snapshot the module globals `names`, restore, run compiled: state must match."""
    module = sys.modules[__name__]
    saved = {n: _copy(getattr(module, n)) for n in names}
    expected = fn(x)
    eager_state = {n: _copy(getattr(module, n)) for n in names}
    for n, v in saved.items():
        setattr(module, n, v)
    counter = CompileCounter()
    actual = kiln.compile(fn, backend=counter)(x)
    assert_equal_state(actual, expected)
    assert_equal_state({n: getattr(module, n) for n in names}, eager_state)
    return counter


def _copy(v):
    return dict(v) if isinstance(v, dict) else v


def test_store_global_replayed():
    counter = run_twice_compare_module_state(rebinds_global, torch.randn(3), ["COUNTER"])
    assert counter.frame_count == 1


def test_global_dict_mutation_replayed():
    counter = run_twice_compare_module_state(writes_global_dict, torch.randn(3), ["REGISTRY"])
    assert counter.frame_count == 1


def test_global_rebound_each_call_not_stale():
    compiled = kiln.compile(rebinds_global, backend=CompileCounter())
    start = COUNTER
    outs = [compiled(torch.zeros(1)) for _ in range(3)]
    assert COUNTER == start + 3
    assert [o.item() for o in outs] == [start + 1, start + 2, start + 3]


def make_cell_writer():
    calls = 0

    def f(x):
        nonlocal calls
        calls += 1
        return x * calls

    return f, lambda: calls


def test_nonlocal_write_from_compiled_function():
    f, read_calls = make_cell_writer()
    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), x * 1)
    torch.testing.assert_close(compiled(x), x * 2)
    assert read_calls() == 2


def test_list_argument_mutations():
    def f(x, items):
        items.append(x + 1)
        items.insert(0, x.sum())
        first = items.pop(1)
        items[0] = items[0] * 2
        items.extend([first])
        return len(items)
    check_graphs(f, torch.randn(3), [torch.ones(1), torch.zeros(1)], graphs=1)


def test_dict_argument_mutations():
    def f(x, d):
        d["new"] = x * 2
        d.pop("gone")
        d.update(extra=x.sum())
        return d["keep"] + d["new"]
    check_graphs(f, torch.randn(3), {"keep": torch.ones(3), "gone": 1}, graphs=1)


def test_nested_container_argument_mutation():
    def f(x, state):
        state["history"].append(x.mean())
        state["count"] += 1
        return x - state["history"][0]
    check_graphs(f, torch.randn(3), {"history": [], "count": 0}, graphs=1)


def test_returned_new_list_is_not_an_argument_alias():
    def f(x, items):
        out = list(items)
        out.append(x)
        return out
    items = [torch.zeros(1)]
    result = kiln.compile(f, backend=CompileCounter())(torch.ones(1), items)
    assert len(items) == 1 and len(result) == 2 and result is not items


def test_output_view_aliases_input():
    def f(x):
        return x[0], x.t()
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.zeros(2, 3)
    row, xt = compiled(x)
    x.add_(5)  # eager semantics: the outputs are views of x and see this
    torch.testing.assert_close(row, x[0])
    torch.testing.assert_close(xt, x.t())


def test_same_tensor_passed_twice():
    def f(a, b):
        a.add_(1)
        return a + b
    compiled = kiln.compile(f, backend=CompileCounter())
    x, y = torch.zeros(3), torch.zeros(3)
    torch.testing.assert_close(compiled(x, y), torch.ones(3))
    z = torch.zeros(3)
    torch.testing.assert_close(compiled(z, z), torch.full((3,), 2.0))  # b is a too: sees the add
    torch.testing.assert_close(z, torch.ones(3))


def test_input_view_of_another_input():
    def f(a, b):
        b.mul_(10)
        return a.sum()
    compiled = kiln.compile(f, backend=CompileCounter())
    base = torch.ones(4)
    torch.testing.assert_close(compiled(base, base[:2]), torch.tensor(22.0))
    torch.testing.assert_close(base, torch.tensor([10.0, 10.0, 1.0, 1.0]))


def test_user_object_created_inside_and_returned():
    class Result:
        def __init__(self, value, tag):
            self.value, self.tag = value, tag

    def f(x):
        r = Result(x * 2, "doubled")
        r.extra = [x.sum()]
        return r
    out = kiln.compile(f, backend=CompileCounter())(torch.ones(3))
    assert type(out).__name__ == "Result" and out.tag == "doubled"
    torch.testing.assert_close(out.value, torch.full((3,), 2.0))
    torch.testing.assert_close(out.extra[0], torch.tensor(3.0))


def test_random_ops_follow_the_global_seed():
    def f(x):
        return x + torch.rand(3) + torch.randn(3)
    compiled = kiln.compile(f, backend=CompileCounter())
    x = torch.zeros(3)
    torch.manual_seed(7)
    expected = f(x)
    torch.manual_seed(7)
    torch.testing.assert_close(compiled(x), expected)


def test_no_tensor_work_no_graph():
    def f(x):
        return x.shape[0] * 2, x.dtype
    counter = check_graphs(f, torch.randn(5))
    assert counter.frame_count == 0


def test_same_output_object_twice():
    def f(x):
        y = x * 2
        return y, y
    a, b = kiln.compile(f, backend=CompileCounter())(torch.randn(3))
    assert a is b


def test_input_returned_inside_container_is_the_input():
    def f(x):
        return {"input": x, "double": x * 2}
    x = torch.randn(3)
    out = kiln.compile(f, backend=CompileCounter())(x)
    assert out["input"] is x


def test_augmented_assignment_mutates_input():
    def f(x):
        x += 1
        x *= 2
        return x
    check_graphs(f, torch.randn(3), graphs=1)


def test_augmented_subscript_assignment_on_input():
    def f(x):
        x[0] += 10
        x[:, 1] -= 1
        return x.sum()
    check_graphs(f, torch.randn(3, 3), graphs=1)


def test_rebinding_does_not_mutate_input():
    def f(x):
        x = x + 1
        return x
    x = torch.zeros(3)
    kiln.compile(f, backend=CompileCounter())(x)
    torch.testing.assert_close(x, torch.zeros(3))


def test_requires_grad_set_on_intermediate():
    def f(x):
        y = x.detach() * 2
        y.requires_grad_()
        return y * 3
    check_graphs(f, torch.randn(3))


def test_input_resized_in_place():
    def f(x):
        x.resize_(2, 2)
        return x.shape
    x = torch.zeros(4)
    assert kiln.compile(f, backend=CompileCounter())(x) == torch.Size([2, 2])
    assert x.shape == (2, 2)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_saved_tensor_hooks_see_only_the_programs_own_saves(backend):
    """Compiling runs ops to trace them; the program's saved-tensor hooks must not see those."""
    calls = {"pack": 0, "unpack": 0}

    def pack(t):
        calls["pack"] += 1
        return t

    def unpack(t):
        calls["unpack"] += 1
        return t

    def f(x, y):
        return x * y

    x, y = torch.ones(4, requires_grad=True), torch.ones(4)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = kiln.compile(f, backend=backend)(x, y)
        assert calls == {"pack": 1, "unpack": 0}  # eager saves y once for x's gradient
        out.sum().backward()
        assert calls == {"pack": 1, "unpack": 1}
    torch.testing.assert_close(x.grad, y)
