"""Library functions and methods without side effects (re, struct, unicodedata, int.from_bytes, ...) on
values capture knows: they run at capture time and their results are constants, so they cost no graph
break; a function marked constant (torch._dynamo.assume_constant_result's mark) is run the same way."""
import functools
import re
import struct
import threading
import unicodedata

import pytest
import torch

import kiln
from tests.utils import CompileCounter, check_graphs

LAYER = re.compile(r"layers\.(\d+)\.")

PURE_CALLS = {
    "re.sub": lambda: re.sub(r"\d+", "#", "block7.layer12"),
    "re.match groups": lambda: re.match(r"(\w+)\.(\d+)", "head.3").groups(),
    "re.findall": lambda: len(re.findall(r"[aeiou]", "attention")),
    "re.split": lambda: re.split(r"[._]", "model.layers_0"),
    "compiled pattern sub": lambda: LAYER.sub("L.", "model.layers.11.mlp"),
    "compiled pattern match group": lambda: int(LAYER.search("model.layers.11.mlp").group(1)),
    "compiled pattern fullmatch": lambda: LAYER.fullmatch("nothing") is None,
    "compiled pattern subn": lambda: LAYER.subn("", "layers.1.layers.2.")[1],
    "struct": lambda: struct.unpack("<hh", struct.pack("<hh", 3, -4)),
    "int.from_bytes": lambda: int.from_bytes(b"\x01\x02", "little"),
    "bytes.fromhex": lambda: bytes.fromhex("0a0b")[1],
    "float.fromhex": lambda: float.fromhex("0x1.8p1"),
    "str.maketrans": lambda: "a-b-c".translate(str.maketrans("-", "_")),
    "unicodedata": lambda: unicodedata.normalize("NFKC", "\u2163"),
}


TORCH_BREAKS = {"bytes.fromhex", "str.maketrans", "unicodedata"}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.torch_differs("breaks the graph on this pure call")) if name in TORCH_BREAKS
    else name for name in PURE_CALLS])
def test_a_pure_call_on_constants_is_folded(name):
    pure = PURE_CALLS[name]

    def fn(x):
        value = pure()
        return x * len(str(value)) + len(repr(value))

    check_graphs(fn, torch.randn(3), graphs=1, fullgraph=True)  # (each was a graph break)


def test_a_changed_global_pattern_is_not_stale():
    global LAYER
    saved = LAYER

    def fn(x):
        return x + len(LAYER.sub("", "model.layers.11.mlp"))

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    x = torch.zeros(2)
    try:
        assert torch.equal(compiled(x), fn(x))
        LAYER = re.compile(r"model\.")
        assert torch.equal(compiled(x), fn(x))
    finally:
        LAYER = saved


def test_a_python_replacement_function_still_runs_as_written():
    seen = []

    def upper(m):
        seen.append(m.group(0))
        return m.group(0).upper()

    def fn(x):
        return x + len(re.sub(r"[a-c]", upper, "abcdef"))

    x = torch.zeros(2)
    expected = fn(x)
    eager_seen, seen[:] = list(seen), []
    assert torch.equal(kiln.compile(fn, backend="eager")(x), expected)
    assert seen == eager_seen  # (its calls are not skipped)


def _marked_constant(fn):
    fn._dynamo_marked_constant = True  # what torch._dynamo.assume_constant_result sets (transformers too)
    return fn


@functools.lru_cache
@_marked_constant
def running_thread_id():
    return threading.get_ident()  # a C call capture cannot follow


def test_a_function_marked_constant_is_run_and_its_result_kept():
    def fn(x):
        return x + 1 if running_thread_id() == threading.main_thread().ident else x - 1

    check_graphs(fn, torch.randn(3), graphs=1, fullgraph=True)



def test_torch_testing_comparison_classes_are_followed():
    """torch's TestCase.assertEqual builds torch.testing's comparison pairs (Python classes of
    torch.testing): capture follows them, and a mismatch raises as in eager."""
    from torch.testing._internal.common_utils import TestCase

    class Case(TestCase):
        def runTest(self):
            pass
    case = Case()

    def checks_count(x, n):
        case.assertEqual(n, 3)
        return x * n
    compiled = kiln.compile(checks_count, backend=CompileCounter(), fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(2), 3), torch.full((2,), 3.0))
    with pytest.raises(AssertionError) as eager_error:
        checks_count(torch.ones(2), 4)
    with pytest.raises(AssertionError) as compiled_error:
        kiln.compile(checks_count, backend=CompileCounter())(torch.ones(2), 4)
    assert str(compiled_error.value) == str(eager_error.value)
