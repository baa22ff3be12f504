"""portable.code_fingerprint's memo (by id, held weakly): a loaded entry's guards ask it on every call,
so it must answer from the memo, forget a code object that died, and never hand a dead code object's
fingerprint to a new one that took its id."""
import gc

from kiln.capture import portable


def make(body):
    ns = {}
    exec(f"def f(x):\n    return {body}\n", ns)
    return ns["f"].__code__


def test_fingerprint_is_remembered_while_the_code_lives_and_forgotten_after():
    code = make("x + 1")
    first = portable.code_fingerprint(code)
    assert portable.code_fingerprint(code) == first and id(code) in portable._CODE_PRINTS
    key = id(code)
    del code
    gc.collect()
    assert key not in portable._CODE_PRINTS


def test_a_new_code_object_at_a_dead_ones_id_gets_its_own_fingerprint():
    for i in range(200):  # freed code objects' memory is reused: some ids come back
        code = make(f"x * {i}")
        fp = portable.code_fingerprint(code)
        assert fp == portable._sha([code.co_code.hex(), code.co_names, code.co_varnames, code.co_freevars,
                                    code.co_cellvars, code.co_argcount, code.co_posonlyargcount,
                                    code.co_kwonlyargcount, code.co_flags, code.co_qualname,
                                    code.co_exceptiontable.hex(), [portable._const_key(c) for c in code.co_consts]])
        del code
    fps = {portable.code_fingerprint(make(f"x * {i}")) for i in range(3)}
    assert len(fps) == 3
