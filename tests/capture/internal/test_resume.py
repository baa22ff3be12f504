"""Resume functions and liveness: a resume code object continues the original at an offset."""
import dis
import types

from kiln.capture.interpreter import instructions
from kiln.capture.resume import live_locals, resume_code


def sample(a, b):
    c = a + b
    d = c * 2
    if d > 10:
        d = d - 1
    return d + a


def offset_of(fn, opname, argval=None, nth=0):
    hits = [i for i in dis.get_instructions(fn) if i.opname == opname and (argval is None or i.argval == argval)]
    return hits[nth].offset


def test_live_locals_at_a_point():
    off = offset_of(sample, "STORE_FAST", "d")
    assert live_locals(sample.__code__, off) == {"a"}  # d is written there; b and c are dead
    first = instructions(sample.__code__)[0][1].offset
    assert live_locals(sample.__code__, first) == {"a", "b"}


def test_resume_code_continues_with_stack_and_locals():
    # resume right at `STORE_FAST d`: the stack holds c * 2, the live local is a
    off = offset_of(sample, "STORE_FAST", "d")
    code = resume_code(sample.__code__, off, [False], ["a"])
    fn = types.FunctionType(code, sample.__globals__)
    assert fn(14, 1) == sample(1, 6)  # c*2 = 14 -> d = 13 -> 13 + 1
    assert fn(4, 1) == 5
    assert resume_code(sample.__code__, off, [False], ["a"]) is code  # cached


def with_closure(x):
    k = x * 2

    def inner():
        return k + 1
    k = k + 1
    return inner()


def first_on_line(fn, text):
    """Offset of the first instruction of the line of `fn` that contains `text` (the stack is empty there)."""
    import inspect
    lines, start = inspect.getsourcelines(fn)
    lineno = start + next(n for n, line in enumerate(lines) if text in line)
    return next(i.offset for i in dis.get_instructions(fn) if i.positions.lineno == lineno)


def test_resume_code_receives_cells_as_free_variables():
    off = first_on_line(with_closure, "return inner()")
    code = resume_code(with_closure.__code__, off, [], ["inner"])
    assert code.co_freevars == ("k",) and not code.co_cellvars
    cell = types.CellType(7)
    inner_code = next(c for c in with_closure.__code__.co_consts if isinstance(c, types.CodeType))
    inner = types.FunctionType(inner_code, {}, "inner", None, (cell,))
    fn = types.FunctionType(code, with_closure.__globals__, "r", None, (cell,))
    assert fn(inner) == 8


def test_resume_code_makes_a_closure_over_a_handed_over_cell():
    # resume before `def inner`: the resume function builds the closure itself, over the cell it was
    # handed as a free variable (3.13 loads that cell with LOAD_FAST, 3.11/3.12 with LOAD_CLOSURE)
    off = first_on_line(with_closure, "def inner")
    code = resume_code(with_closure.__code__, off, [], [])
    cell = types.CellType(7)
    fn = types.FunctionType(code, with_closure.__globals__, "r", None, (cell,))
    assert fn() == 9 and cell.cell_contents == 8


def swaps(a, b):
    a, b = b, a          # 3.13: STORE_FAST_STORE_FAST
    c = a * 2            # 3.13: STORE_FAST_LOAD_FAST between these lines
    d = a + b            # 3.13: LOAD_FAST_LOAD_FAST
    return c + d


def test_live_locals_through_paired_local_instructions():
    assert live_locals(swaps.__code__, first_on_line(swaps, "a, b = b, a")) == {"a", "b"}
    assert live_locals(swaps.__code__, first_on_line(swaps, "c = a * 2")) == {"a", "b"}
    assert live_locals(swaps.__code__, first_on_line(swaps, "d = a + b")) == {"a", "b", "c"}
    assert live_locals(swaps.__code__, first_on_line(swaps, "return")) == {"c", "d"}


def test_resume_after_paired_local_instructions():
    off = first_on_line(swaps, "d = a + b")
    code = resume_code(swaps.__code__, off, [], ["a", "b", "c"])
    assert types.FunctionType(code, {})(3, 1, 6) == swaps(1, 3)


def with_try(x, y):
    try:
        z = 10 // y            # ZeroDivisionError for y == 0: the handler below; TypeError for None: out
    except ZeroDivisionError:
        z = -1
    return z + x


def test_resume_inside_a_try_keeps_handlers_and_line_numbers():
    import inspect
    import traceback
    off = first_on_line(with_try, "z = 10 // y")
    code = resume_code(with_try.__code__, off, [], ["x", "y"])
    fn = types.FunctionType(code, {})
    assert fn(1, 2) == with_try(1, 2) and fn(1, 0) == with_try(1, 0)  # the exception table survived
    try:
        fn(1, None)
    except TypeError as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
    lines, start = inspect.getsourcelines(with_try)
    assert "z = 10 // y" in lines[frame.lineno - start]  # the line table maps to the user's line
