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
a NULL, how to call `resolve`) lives in one table, `_FACTS`: add 3.12 and 3.13 there.
"""
import dis
import sys
import types
import weakref

from bytecode import Bytecode, Instr

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


# ---- the version table ------------------------------------------------------------------------------
class _Python311:
    """CPython 3.11. A call is `[NULL | method] [callable | self] args... KW_NAMES? PRECALL n; CALL n`;
    PUSH_NULL and LOAD_GLOBAL (low bit of its argument) put the NULL below the callable; LOAD_METHOD
    pushes [method, self] or [NULL, attribute] (rewritten to LOAD_ATTR so it is always the latter);
    CALL_FUNCTION_EX is `NULL callable args kwargs?`."""

    def effect(self, inst):
        """-> (values popped, kinds pushed) for instructions whose stack kinds matter, else None."""
        name, arg = inst.opname, inst.arg
        if name == "PUSH_NULL":
            return 0, [NULL]
        if name == "LOAD_GLOBAL":
            return 0, [NULL, VALUE] if arg & 1 else [VALUE]
        if name == "LOAD_METHOD":  # after normalize(): [NULL, bound attribute]
            return 1, [NULL, VALUE]
        if name == "PRECALL":      # PRECALL and CALL together pop NULL|method, callable|self, args
            return arg + 2, [VALUE]
        if name == "CALL":
            return 0, []
        if name == "CALL_FUNCTION_EX":
            return 3 + (arg & 1), [VALUE]
        if name == "RETURN_GENERATOR":  # the generator is resumed with a value, popped by the next POP_TOP
            return 0, [VALUE]
        return None

    def callable_depth(self, inst, kinds):
        """The stack depth (1 = top) of the callable a call site calls, or None when it is not a
        plain call (the slot below the callable is not a NULL)."""
        if inst.opname == "PRECALL":
            depth = inst.arg + 1
        elif inst.opname == "CALL_FUNCTION_EX":
            depth = 2 + (inst.arg & 1)
        else:
            return None
        if len(kinds) > depth and kinds[-depth - 1] == NULL:
            return depth
        return None

    def call_starts_at(self, insts, n):
        """Index of the first instruction of the call sequence ending in insts[n] (KW_NAMES sets the
        keyword names for the next call, so `resolve` must be called before it)."""
        return n - 1 if n and insts[n - 1].opname == "KW_NAMES" else n

    def normalize(self, instr):
        """Instructions to use instead of `instr` so every call site has its NULL below the callable."""
        if instr.name == "LOAD_METHOD":
            loc = instr.location
            return [Instr("LOAD_ATTR", instr.arg, location=loc), Instr("PUSH_NULL", location=loc),
                    Instr("SWAP", 2, location=loc)]
        return None

    def resolve_slot(self, depth, resolve, loc):
        """Instructions replacing the value at `depth` (1 = top) by resolve(value), stack otherwise as is."""
        return [Instr("PUSH_NULL", location=loc), Instr("LOAD_CONST", resolve, location=loc),
                Instr("COPY", depth + 2, location=loc), Instr("PRECALL", 1, location=loc),
                Instr("CALL", 1, location=loc), Instr("SWAP", depth + 1, location=loc),
                Instr("POP_TOP", location=loc)]


_FACTS = {(3, 11): _Python311()}  # helper P: add (3, 12) and (3, 13) here


def _facts():
    facts = _FACTS.get(sys.version_info[:2])
    if facts is None:
        raise CannotRewrite(f"no call-site table for Python {sys.version_info[0]}.{sys.version_info[1]}")
    return facts


# ---- the rewrite ------------------------------------------------------------------------------------
def rewrite_calls(code, resolve):
    """A copy of `code` whose call sites call `resolve(callable)(args...)`. Raises CannotRewrite."""
    facts = _facts()
    insts = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    sites = _call_sites(code, insts, facts)
    bc = Bytecode.from_code(code)
    out, n = [], 0
    for item in bc:
        if not isinstance(item, Instr):
            out.append(item)
            continue
        depth = sites.get(n)
        if depth is not None:
            out.extend(facts.resolve_slot(depth, resolve, item.location))
        n += 1
        if isinstance(item.arg, types.CodeType):
            item = Instr(item.name, rewrite_calls(item.arg, resolve), location=item.location)
        out.extend(facts.normalize(item) or [item])
    if n != len(insts):
        raise CannotRewrite(f"{code.co_qualname}: bytecode and dis disagree on the instructions")
    bc[:] = out
    new = bc.to_code()
    return new.replace(co_consts=new.co_consts + (_Original(code),))


def _call_sites(code, insts, facts):
    """{index of the instruction where `resolve` goes: depth of the callable} for each plain call."""
    kinds_at = _stack_kinds(code, insts, facts)
    sites = {}
    for n, inst in enumerate(insts):
        kinds = kinds_at[n]
        if kinds is None:  # unreachable
            continue
        depth = facts.callable_depth(inst, kinds)
        if depth is not None:
            sites[facts.call_starts_at(insts, n)] = depth
    return sites


_NO_FALLTHROUGH = {"RETURN_VALUE", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD", "JUMP_BACKWARD",
                   "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP", "JUMP_NO_INTERRUPT", "RETURN_CONST"}


def _stack_kinds(code, insts, facts):
    """For each instruction, the kinds (NULL, VALUE, UNKNOWN) of the stack slots before it runs, or
    None where it is unreachable. A worklist over jumps, fall-throughs and exception handlers."""
    index_of = _index_of_offsets(code, insts)
    handlers = dis._parse_exception_table(code)
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
        jumps = inst.opcode in dis.hasjrel or inst.opcode in dis.hasjabs
        if jumps:
            _merge(code, kinds_at, work, index_of[inst.argval], _after(code, facts, inst, kinds, jump=True))
        if inst.opname not in _NO_FALLTHROUGH and n + 1 < len(insts):
            _merge(code, kinds_at, work, n + 1, _after(code, facts, inst, kinds, jump=False if jumps else None))
    return kinds_at


def _after(code, facts, inst, kinds, jump):
    """The stack kinds after `inst` runs (taking its jump or not)."""
    if inst.opname == "SWAP":
        k = list(kinds)
        k[-1], k[-inst.arg] = k[-inst.arg], k[-1]
        return tuple(k)
    if inst.opname == "COPY":
        return kinds + (kinds[-inst.arg],)
    effect = facts.effect(inst)
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
