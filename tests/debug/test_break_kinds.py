"""Every place capture raises kiln.Unsupported gives the break a kind from the registry: named at
the raise site, or found from its message (kiln/debug/break_kinds.py), never `other`. A new raise
site whose message matches no kind fails here: name its kind (`Unsupported(msg, kind=...)`)."""
import ast
import pathlib

import kiln
from kiln.debug import break_kinds

KILN = pathlib.Path(kiln.__file__).parent


def _message_shape(node):
    """A message's literal parts, X for each placeholder (f"call to {fn}" -> "call to X")."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
    return None


def _raise_sites():
    for path in sorted(KILN.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Unsupported" and node.args:
                yield f"{path.relative_to(KILN)}:{node.lineno}", node


def test_every_raise_site_has_a_kind():
    untyped, unknown = [], []
    for where, call in _raise_sites():
        keywords = {k.arg: k.value for k in call.keywords}
        if "kind" in keywords:
            kind = keywords["kind"]
            if not (isinstance(kind, ast.Constant) and kind.value in break_kinds.KINDS):
                unknown.append(where)
            continue
        message = _message_shape(call.args[0])
        if message is None:  # a message made elsewhere (re-raised errors): checked where it is made
            continue
        raised = object() if "python_exception" in keywords else None
        if break_kinds.classify(message, raised) == "other":
            untyped.append(f"{where}: {message}")
    assert not unknown, unknown
    assert not untyped, "\n".join(untyped)


def test_classification_of_common_breaks():
    cases = {
        "print() has side effects outside the graph": "print_or_log",
        "branching on a tensor's value (data-dependent control flow)": "data_dependent",
        "a value computed from tensor data (item()) is needed in Python": "data_dependent",
        "call to zlib.crc32 (not Python code kiln can follow)": "unsupported_call",
        "call to numpy.random.rand (not Python code kiln can follow)": "numpy",
        "call to kiln.disable'd function helper": "disabled_function",
        "torch.manual_seed changes global state": "global_state",
        "f() missing argument 'x'": "python_exception",
    }
    for message, kind in cases.items():
        assert break_kinds.classify(message) == kind, message
    assert break_kinds.classify("anything", python_exception=ValueError()) == "python_exception"
