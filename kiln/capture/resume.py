"""Resume functions: the rest of a frame after a graph break, as a new code object.

`resume_code(code, offset, stack_nulls, live)` copies `code` (with the `bytecode` package) and puts a
prologue in front: it pushes the live stack (its first arguments; NULLs re-pushed with PUSH_NULL),
binds the live locals (its other arguments) and jumps to `offset`. The original's cell variables
become free variables, so the glue can hand over the very cells that closures made before the
break captured. One code object per (code, offset, layout), so its cache is shared by recompiles;
they are kept while `code` lives.
"""
import weakref

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label, TryBegin, TryEnd

from kiln.capture import bytecode_facts as facts
from kiln.capture.identity_table import IdentityTable
from kiln.capture.code_index import instructions

_CACHE = IdentityTable()  # code -> {(offset, stack_nulls, live): resume code}
_ORIGIN = IdentityTable()  # resume code -> (weak ref to the code, (offset, stack_nulls, live)) it was made from


def live_locals(code, offset):
    """Fast locals that may be read at or after `offset` before being written."""
    insts, index = instructions(code)
    handlers = [(e.start, e.end, e.target) for e in facts.exception_table(code)]
    succ = []
    for n, inst in enumerate(insts):
        s = []
        if inst.opname not in facts.NO_FALLTHROUGH and n + 1 < len(insts):
            s.append(n + 1)
        if facts.is_jump(inst):
            s.append(index[inst.argval])
        for start, end, target in handlers:
            if start <= inst.offset < end:
                s.append(index[target])
        succ.append(s)
    live = [set() for _ in insts]
    changed = True
    while changed:
        changed = False
        for n in range(len(insts) - 1, -1, -1):
            inst = insts[n]
            out = set()
            for s in succ[n]:
                out |= live[s]
            for access, name in reversed(facts.local_accesses(inst)):
                if access == "store":
                    out.discard(name)
                else:
                    out.add(name)
            if out != live[n]:
                live[n] = out
                changed = True
    first = live[index[offset]]
    if uses_zero_arg_super(code):
        first = first | {code.co_varnames[0]}  # super() reads it without a LOAD_FAST
    return first


def uses_zero_arg_super(code):
    """Whether `code` may call super() with no arguments, which reads the frame's first local (self)
    and the __class__ cell."""
    return "__class__" in code.co_freevars and code.co_argcount > 0


def parameters(code, stack_nulls, live):
    """-> (names of the stack items, the resume function's parameter names in order): the live stack,
    then the live locals; a function that calls super() keeps its first argument first, where
    super() looks for it."""
    stack = [f"__stack{i}" for i, null in enumerate(stack_nulls) if not null]
    first = code.co_varnames[0] if code.co_argcount else None
    if uses_zero_arg_super(code) and first in live:
        return stack, [first] + stack + [n for n in live if n != first]
    return stack, stack + list(live)


_GENERATOR_FLAGS = 0x20 | 0x100 | 0x200  # CO_GENERATOR, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR (kept by
# a paused generator's copy); CO_VARARGS, CO_VARKEYWORDS, CO_NESTED and CO_COROUTINE are dropped


def resume_code(code, offset, stack_nulls, live, generator=False):
    """A code object taking `parameters(code, stack_nulls, live)` (the non-NULL stack items and live
    locals) that continues `code` at `offset`. `generator`: `code` is a generator's and `offset` one of
    its yields: the copy is a generator function whose generator, on its first next(), runs straight
    to that yield (yielding the item on top of the stack given) and is then paused where the original
    was, inside the same try blocks, so send/throw/close continue it as they would the original."""
    made = _CACHE.setdefault(code, dict)
    key = (offset, tuple(stack_nulls), tuple(live), generator)
    found = made.get(key)
    if found is not None:
        return found
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    target_pos = instructions(code)[1][offset]
    body, seen, label = [], 0, Label()
    open_try, reopened = None, {}  # the exception-table range the jump lands in, split at the label
    for item in bc:
        if isinstance(item, TryBegin):
            open_try = item
        elif isinstance(item, TryEnd):
            open_try = None
            item = TryEnd(reopened.get(id(item.entry), item.entry))
        if isinstance(item, Instr):
            if seen == target_pos:
                body += _split_range(open_try, label, reopened)
            seen += 1
            if item.name in ("MAKE_CELL", "COPY_FREE_VARS"):
                continue  # the prologue's job: the new prologue hands cells over as free variables
            if isinstance(item.arg, CellVar):
                item = Instr(item.name, FreeVar(item.arg.name), location=item.location)
        body.append(item)
    stack_names, argnames = parameters(code, stack_nulls, live)
    loc = _location_of(bc, target_pos)
    prologue = []
    freevars = list(code.co_freevars) + list(code.co_cellvars)
    if freevars:
        prologue.append(Instr("COPY_FREE_VARS", len(freevars), location=loc))
    if generator:
        prologue += [Instr("RETURN_GENERATOR", location=loc), Instr("POP_TOP", location=loc)]
    prologue.append(Instr("RESUME", 0, location=loc))
    i = 0
    for null in stack_nulls:
        if null:
            prologue.append(Instr("PUSH_NULL", location=loc))
        else:
            prologue.append(Instr("LOAD_FAST", stack_names[i], location=loc))
            i += 1
    prologue.append(Instr("JUMP_FORWARD", label, location=loc))
    new = Bytecode(prologue + body)
    new.argnames = argnames
    new.argcount = len(new.argnames)
    new.posonlyargcount = new.kwonlyargcount = 0
    new.first_lineno = code.co_firstlineno
    new.name = f"__resume_{code.co_name}_at_{offset}"
    new.qualname = new.name
    if generator:  # (a generator takes its name from its code: it is the original's, paused)
        new.name, new.qualname = code.co_name, code.co_qualname
    new.filename = code.co_filename
    new.docstring = None
    new.cellvars = []
    new.freevars = freevars
    new.flags = code.co_flags & ~(0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200) | 0x10 * bool(freevars) | \
        (code.co_flags & _GENERATOR_FLAGS if generator else 0)
    new.exception_table = None
    out = new.to_code()
    made[key] = out
    if not generator:  # (a paused generator's copy is not a resume function the capture cache stores)
        _ORIGIN[out] = (weakref.ref(code), key[:3])  # (weak: the resume code must not keep its original alive)
    return out


def _split_range(open_try, label, reopened):
    """The label the prologue jumps to, in the exception-table range `open_try` (or None) of the
    original: the range ends before the label and a copy begins after it, so that the stack depth at
    its handler is computed along the path the resume function takes (the original start is dead
    code now; its depth would be unknown)."""
    if open_try is None:
        return [label]
    again = TryBegin(open_try.target, open_try.push_lasti, open_try.stack_depth)
    reopened[id(open_try)] = again
    return [TryEnd(open_try), label, again]


def resumed_from(code):
    """The code a resume function was made from (itself for any other code). (Not
    call_sites.original_code: that maps a copy rewritten for eager_frames to its original.)"""
    origin = _ORIGIN.get(code)
    original = origin[0]() if origin is not None else None
    return original if original is not None else code


def resume_spot(rcode, code):
    """[offset, stack_nulls, live] when `rcode` is a resume function `resume_code` made from `code`
    (the capture cache stores it so, and remakes it with resume_code); None otherwise."""
    origin = _ORIGIN.get(rcode)
    if origin is None or origin[0]() is not code:
        return None
    offset, stack_nulls, live = origin[1]
    return [offset, list(stack_nulls), list(live)]


def _location_of(bc, target_pos):
    seen = 0
    for item in bc:
        if isinstance(item, Instr):
            if seen == target_pos:
                return item.location
            seen += 1
    return None


def reset():
    _CACHE.clear()
    _ORIGIN.clear()

