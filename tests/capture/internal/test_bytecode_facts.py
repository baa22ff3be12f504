"""The per-version opcode facts: every opcode of the running CPython is handled or refused by name."""
import dis

from kiln.capture import bytecode_facts as facts
from kiln.capture.interpreter import NOT_CAPTURED, Frame


def test_every_opcode_has_a_handler_or_a_reason():
    missing = [name for name in facts.opcodes() if not hasattr(Frame, name) and name not in NOT_CAPTURED]
    assert not missing, f"opcodes with neither a handler nor a NOT_CAPTURED reason: {missing}"


def test_null_slot_order_matches_this_versions_bytecode():
    # `f(x)` with f a global: the NULL slot sits on the side of the callable that this version uses
    def call_global(x):
        return len(x)
    load = next(i for i in dis.get_instructions(call_global) if i.opname == "LOAD_GLOBAL")
    assert load.arg & 1
    assert ("NULL +" in load.argrepr) != facts.NULL_AFTER_CALLABLE  # dis: "NULL + len" or "len + NULL"
    assert facts.with_null("f", None) == (["f", None] if facts.NULL_AFTER_CALLABLE else [None, "f"])
    assert facts.callable_and_self(*facts.with_null("f", None), is_null=lambda v: v is None) == ("f", None)


def test_for_iter_exit_skips_what_cpython_skips():
    def loop(xs):
        for x in xs:
            pass
        return 1
    insts = list(dis.get_instructions(loop))
    for_iter = next(i for i in insts if i.opname == "FOR_ITER")
    after = [i.opname for i in insts if i.offset >= for_iter.argval][:facts.FOR_ITER_EXIT_SKIPS]
    assert after == ["END_FOR", "POP_TOP"][:facts.FOR_ITER_EXIT_SKIPS]
