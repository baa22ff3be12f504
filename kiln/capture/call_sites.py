"""Rewrite a code object so that every call site first passes its callable through `resolve`.

`rewrite_calls(code, resolve)` returns a copy of `code` (made with the `bytecode` package) in which
each call `f(args...)` runs as `resolve(f)(args...)`: the arguments are evaluated first, exactly as
before, then `resolve` swaps the callable on the stack for what should really be called, and the
original call instruction calls it. The call itself stays in the rewritten frame, so `super()`,
`locals()` and `sys._getframe()` see that frame, and tracebacks of natively called code gain no frame.
Code objects among the constants (lambdas, comprehensions, nested functions, class bodies) are
rewritten too. The copy remembers its original (`original_code`), so caches keyed by code objects
see one code whether a function was made from the original or the copy.

Only call sites whose callable sits above a NULL are rewritten: a small abstract interpretation of
the stack tells them apart from the compiler's method-form calls (a `with` block's exit, an
`assert`'s message, a decorator), where the slot above the NULL is not the callable.

What differs between CPython versions (how a call site lays out its stack, which instructions push
a NULL or must stay next to the call) is asked of bytecode_facts, as the interpreter asks it.
"""
import dis
import types
import weakref

from bytecode import Bytecode, Instr

from kiln.capture import bytecode_facts as facts

NULL, VALUE, UNKNOWN = "N", "V", "?"


class _Original:
    """The last constant of a rewritten code object: the code it was made from, held weakly (the
    copy is kept for as long as the original lives, and must not keep it alive)."""
    __slots__ = ("ref",)

    def __init__(self, code):
        self.ref = weakref.ref(code)

    def __repr__(self):
        return "<kiln: a rewritten copy>"


def original_code(code):
    """The code object `code` was rewritten from (`code` itself if it was not rewritten, or if its
    original is gone)."""
    consts = code.co_consts
    if consts and type(consts[-1]) is _Original:
        return consts[-1].ref() or code
    return code


class CannotRewrite(Exception):
    """The stack analysis did not settle (a layout this table does not know): run the code as it is."""


# ---- call sites, in terms of bytecode_facts ---------------------------------------------------------
# A call site is `[two call slots] operands... prefixes... call`: the slots hold the callable and a
# NULL (a plain call) or a method and its self (3.11/3.12: [NULL | method, callable | self]; 3.13:
# [callable | method, NULL | self]). Method loads are rewritten to a plain attribute load and a NULL
# (LOAD_METHOD, and LOAD_ATTR / LOAD_SUPER_ATTR with their method bit), so the callable of every call
# that reads like `f(...)` is a value in a slot beside a NULL. PUSH_NULL and LOAD_GLOBAL's low bit push
# the NULL. Everything version-specific is asked of bytecode_facts.

def _effect(inst):
    """-> (values popped, kinds pushed) for instructions whose stack kinds matter, else None."""
    name = inst.opname
    if name == "PUSH_NULL":
        return 0, [NULL]
    if (name == "LOAD_GLOBAL" and inst.arg & 1) or facts.loads_method(inst):  # after _normalize
        pushed = facts.with_null(VALUE, NULL)
        return len(pushed) - dis.stack_effect(inst.opcode, inst.arg), pushed
    if name in facts.CALL_PREFIXES:
        return 0, []
    operands = facts.call_operands(inst)
    if operands is not None:  # pops both call slots and the operands, pushes the result
        return operands + 2, [VALUE]
    if name == "RETURN_GENERATOR":  # the generator is resumed with a value, popped by the next POP_TOP
        return 0, [VALUE]
    return None


def _callable_depth(inst, kinds):
    """The stack depth (1 = top) of the callable a call site calls, or None when it is not a plain
    call (its other call slot is not a NULL)."""
    operands = facts.call_operands(inst)
    if operands is None:
        return None
    depth, null_depth = facts.call_slot_depths(operands)
    if len(kinds) >= null_depth and kinds[-null_depth] == NULL:
        return depth
    return None


def _call_starts_at(insts, n):
    """Index of the first instruction of the call sequence ending in insts[n] (KW_NAMES sets the
    keyword names for the next call, so `resolve` must be called before it)."""
    while n and insts[n - 1].opname in facts.CALL_PREFIXES:
        n -= 1
    return n


def _normalize(instr, inst):
    """Instructions to use instead of `instr` (whose dis form is `inst`) so that every method load
    pushes a bound attribute and a NULL, in the version's slot order; None to keep it."""
    if not facts.loads_method(inst):
        return None
    loc, arg = instr.location, instr.arg
    if isinstance(arg, tuple):  # the bytecode package's (method bit, ..., name) form of 3.12+
        arg = (False,) + arg[1:]
    plain = Instr("LOAD_ATTR" if instr.name == "LOAD_METHOD" else instr.name, arg, location=loc)
    if facts.NULL_AFTER_CALLABLE:
        return [plain, Instr("PUSH_NULL", location=loc)]
    return [plain, Instr("PUSH_NULL", location=loc), Instr("SWAP", 2, location=loc)]


_RESOLVE_SLOTS = 3  # the most stack slots _resolve_slot's instructions add


def _resolve_slot(depth, resolve, loc):
    """Instructions replacing the value at `depth` (1 = top) by resolve(value), stack otherwise as is."""
    call = [Instr("CALL", 1, location=loc)]
    if facts.PRECALL_BEFORE_CALL:
        call.insert(0, Instr("PRECALL", 1, location=loc))
    return facts.with_null(Instr("LOAD_CONST", resolve, location=loc), Instr("PUSH_NULL", location=loc)) + \
        [Instr("COPY", depth + 2, location=loc)] + call + \
        [Instr("SWAP", depth + 1, location=loc), Instr("POP_TOP", location=loc)]


# ---- the rewrite ------------------------------------------------------------------------------------
def rewrite_calls(code, resolve):
    """A copy of `code` whose call sites call `resolve(callable)(args...)`. Raises CannotRewrite."""
    insts = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    sites = _call_sites(code, insts)
    # the handlers' stack depths are the original's (a call site's extra slots are gone again at every
    # instruction boundary): kept as they are, not recomputed by flow, which cannot reach a handler
    # whose range a resume function's prologue jumps into the middle of
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    out, n = [], 0
    for item in bc:
        if not isinstance(item, Instr):
            out.append(item)
            continue
        if n >= len(insts) or insts[n].opname != item.name:
            raise CannotRewrite(f"{code.co_qualname}: bytecode and dis disagree on the instructions")
        depth = sites.get(n)
        if depth is not None:
            out.extend(_resolve_slot(depth, resolve, item.location))
        if isinstance(item.arg, types.CodeType):
            item = Instr(item.name, rewrite_calls(item.arg, resolve), location=item.location)
        out.extend(_normalize(item, insts[n]) or [item])
        n += 1
    if n != len(insts):
        raise CannotRewrite(f"{code.co_qualname}: bytecode and dis disagree on the instructions")
    bc[:] = out
    new = bc.to_code(compute_exception_stack_depths=False)
    # (room for the handlers too, which the flow from the entry may not reach)
    return new.replace(co_consts=new.co_consts + (_Original(code),),
                       co_stacksize=max(new.co_stacksize, code.co_stacksize + _RESOLVE_SLOTS))


def _call_sites(code, insts):
    """{index of the instruction where `resolve` goes: depth of the callable} for each plain call."""
    kinds_at = _stack_kinds(code, insts)
    sites = {}
    for n, inst in enumerate(insts):
        kinds = kinds_at[n]
        if kinds is None:  # unreachable
            continue
        depth = _callable_depth(inst, kinds)
        if depth is not None:
            sites[_call_starts_at(insts, n)] = depth
    return sites


def _stack_kinds(code, insts):
    """For each instruction, the kinds (NULL, VALUE, UNKNOWN) of the stack slots before it runs, or
    None where it is unreachable. A worklist over jumps, fall-throughs and exception handlers."""
    index_of = _index_of_offsets(code, insts)
    handlers = facts.exception_table(code)
    kinds_at = [None] * len(insts)
    kinds_at[0] = ()
    work = [0]
    while work:
        n = work.pop()
        inst, kinds = insts[n], kinds_at[n]
        for e in handlers:
            if e.start <= inst.offset < e.end:
                if e.depth > len(kinds):
                    raise CannotRewrite(f"{code.co_qualname}: handler depth {e.depth} above the stack")
                _merge(code, kinds_at, work, index_of[e.target], kinds[:e.depth] + (VALUE,) * (1 + e.lasti))
        jumps = facts.is_jump(inst)
        if jumps:
            _merge(code, kinds_at, work, index_of[inst.argval], _after(code, inst, kinds, jump=True))
        if inst.opname not in facts.NO_FALLTHROUGH and n + 1 < len(insts):
            _merge(code, kinds_at, work, n + 1, _after(code, inst, kinds, jump=False if jumps else None))
    return kinds_at


def _after(code, inst, kinds, jump):
    """The stack kinds after `inst` runs (taking its jump or not)."""
    if inst.opname == "SWAP":
        k = list(kinds)
        k[-1], k[-inst.arg] = k[-inst.arg], k[-1]
        return tuple(k)
    if inst.opname == "COPY":
        return kinds + (kinds[-inst.arg],)
    effect = _effect(inst)
    if effect is None:
        net = dis.stack_effect(inst.opcode, inst.arg if inst.opcode >= dis.HAVE_ARGUMENT else None, jump=jump)
        # other instructions neither pop nor push a NULL: what they pop and push are all values
        pops, pushed = max(0, -net), [VALUE] * max(0, net)
    else:
        pops, pushed = effect
    if pops > len(kinds):
        raise CannotRewrite(f"{code.co_qualname}: {inst.opname} at {inst.offset} pops below the stack")
    return kinds[:len(kinds) - pops] + tuple(pushed)


def _merge(code, kinds_at, work, n, kinds):
    old = kinds_at[n]
    if old is None:
        kinds_at[n] = kinds
        work.append(n)
        return
    if len(old) != len(kinds):
        raise CannotRewrite(f"{code.co_qualname}: stack depths {len(old)} and {len(kinds)} meet at one instruction")
    merged = tuple(a if a == b else UNKNOWN for a, b in zip(old, kinds))
    if merged != old:
        kinds_at[n] = merged
        work.append(n)


def _index_of_offsets(code, insts):
    """offset -> instruction index; an EXTENDED_ARG prefix (a jump may target it) maps to the
    instruction it extends."""
    index_of, n = {}, 0
    for i in dis.get_instructions(code):
        index_of[i.offset] = n
        if i.opname != "EXTENDED_ARG":
            n += 1
    return index_of
