"""fullgraph=True: every graph-break construct raises kiln.Unsupported naming the construct and the
user's file:line; code without breaks compiles to exactly one graph."""
import inspect
import logging
import os
import re
import zlib

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs

log = logging.getLogger(__name__)
THIS_FILE = os.path.basename(__file__)


@kiln.disable
def disabled_helper(t):
    return t * 100


def uses_print(x):
    y = x + 1
    print(y)  # BREAK
    return y


def uses_logging(x):
    y = x + 1
    log.warning("y computed")  # BREAK
    return y


def uses_item(x):
    if x.sum().item() > 0:  # BREAK
        return x
    return -x


def uses_tolist(x):
    return x + 1 if x.int().tolist()[0] > 0 else x - 1  # BREAK


def uses_tensor_bool(x):
    if x.sum() > 0:  # BREAK
        return x + 1
    return x - 1


def uses_disabled(x):
    return disabled_helper(x) + 1  # BREAK


def uses_unknown_c_function(x):
    return x * zlib.crc32(b"kiln")  # BREAK


def print_hook(module, args, out):
    print("hook")  # BREAK


PRINTING_HOOKED = torch.nn.Identity()
PRINTING_HOOKED.register_forward_hook(print_hook)


def uses_print_in_forward_hook(x):
    return PRINTING_HOOKED(x + 1)  # BREAK


def uses_break_in_callee(x):
    def inner(t):
        print("inside")  # BREAK
        return t * 2
    return inner(x + 1)


def break_lines(*fns):
    """Lines marked `# BREAK` in these functions: the construct's line or a user call site leading to it."""
    marked = []
    for fn in fns:
        lines, start = inspect.getsourcelines(fn)
        marked += [start + i for i, line in enumerate(lines) if "# BREAK" in line]
    return marked


HELPERS = {uses_print_in_forward_hook: (print_hook,)}  # where else a function's break may be reported


@pytest.mark.parametrize("fn, construct", [
    (uses_print, r"print"), (uses_logging, r"warning|log"), (uses_item, r"item"),
    (uses_tolist, r"tolist|data.dependent"),
    (uses_tensor_bool, r"bool|data.dependent|branch|\bif\b"), (uses_disabled, r"disable"),
    (uses_unknown_c_function, r"crc32"), (uses_break_in_callee, r"print"),
    (uses_print_in_forward_hook, r"print"),
], ids=lambda v: getattr(v, "__name__", None))
def test_break_raises_unsupported_naming_construct_and_line(fn, construct):
    compiled = kiln.compile(fn, backend=CompileCounter(), fullgraph=True)
    with pytest.raises(kiln.Unsupported) as info:
        compiled(torch.randn(4))
    message = str(info.value)
    assert re.search(construct, message, re.IGNORECASE), message
    lines = "|".join(map(str, break_lines(fn, *HELPERS.get(fn, ()))))
    assert re.search(rf"{re.escape(THIS_FILE)}\D{{1,12}}({lines})\b", message), message


def test_unsupported_is_a_kiln_error():
    if not isinstance(kiln.Unsupported, tuple):  # under the torch peer it is torch's own class
        assert issubclass(kiln.Unsupported, kiln.KilnError)


def test_unsupported_leaves_inputs_unmutated_by_partial_graph():
    def f(x):
        x.add_(1)
        print("break")
        return x
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.zeros(3)
    with pytest.raises(kiln.Unsupported):
        compiled(x)
    assert x.sum().item() == 0.0  # the error comes at capture, before any graph ran


@pytest.mark.parametrize("fn", [
    lambda x: x.sin().cos() + x.shape[0],
    lambda x: [t * 2 for t in x.unbind(0)],
    lambda x: torch.nn.functional.softmax(x, -1) if x.ndim == 2 else x,
], ids=["pointwise", "comprehension", "metadata_branch"])
def test_fullgraph_without_breaks_one_graph(fn):
    check_graphs(fn, torch.randn(3, 4), graphs=1, fullgraph=True)


def test_fullgraph_module():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


def test_fullgraph_decorator_form():
    @kiln.compile(fullgraph=True, backend="eager")
    def f(x):
        print("no")
        return x

    with pytest.raises(kiln.Unsupported):
        f(torch.randn(2))


def single_graph_programs():
    """Every one-graph program of the other capture test files, for a fullgraph=True sweep."""
    from tests.capture import test_classes, test_control_flow, test_functions, test_python_values, test_tensors
    programs = [(fn, n) for fn, n in test_python_values.CASES]
    programs += [(fn, 1) for mod in (test_control_flow, test_functions, test_classes, test_tensors)
                 for fn in mod.CASES]
    return [pytest.param(fn, n, id=f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}") for fn, n in programs]


@pytest.mark.parametrize("fn, n_tensors", single_graph_programs())
def test_fullgraph_sweep(fn, n_tensors):
    shape = (4, 3) if fn.__module__.endswith("test_tensors") else (3, 4)
    check_graphs(fn, *[torch.randn(*shape) for _ in range(n_tensors)], graphs=1, fullgraph=True)
