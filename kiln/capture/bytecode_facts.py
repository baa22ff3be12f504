"""What differs between the CPython versions kiln captures (3.11, 3.12, 3.13), in one place.

The interpreter, resume functions and glue ask here instead of testing `sys.version_info`
themselves. Each fact says what CPython does on each version; the handlers in interpreter.py are
one per opcode, and an opcode that exists on one version only simply has its handler unused on
the others.
"""
import dis
import sys

VERSION = sys.version_info[:2]

# A call's NULL slot (no bound self). 3.11/3.12: [NULL, callable, args...] (PUSH_NULL, and the low bit
# of LOAD_GLOBAL / LOAD_ATTR, push the NULL before the callable); 3.13: [callable, NULL, args...].
NULL_AFTER_CALLABLE = VERSION >= (3, 13)

# LOAD_ATTR's low bit asks for a method (push [NULL, attr] or [method, self] for a call), on 3.12+;
# on 3.11 its argument is the name's index alone (LOAD_METHOD does the method load).
LOAD_ATTR_METHOD_BIT = VERSION >= (3, 12)

# FOR_ITER at the end of its iterator pops the iterator and jumps to its target; on 3.12 it skips the
# END_FOR there, on 3.13 the END_FOR and the POP_TOP after it (they clean up only on other paths).
FOR_ITER_EXIT_SKIPS = {(3, 11): 0, (3, 12): 1}.get(VERSION, 2)

# END_FOR (reached only where CPython does not skip it): pops the iterator and the last item on 3.12;
# on 3.13 it pops one value and a POP_TOP follows.
END_FOR_POPS = 2 if VERSION == (3, 12) else 1

# SEND when the sub-iterator returns: 3.11 replaces the receiver with the result; 3.12+ pushes the
# result above the receiver and jumps to END_SEND, which removes the receiver.
SEND_KEEPS_RECEIVER = VERSION >= (3, 12)

# A closure's cells: 3.11/3.12 load them with LOAD_CLOSURE; on 3.13 that is LOAD_FAST of the cell's slot.
CELLS_LOADED_BY_LOAD_FAST = VERSION >= (3, 13)

# COMPARE_OP: its argument packs the comparison differently on each version (3.13 adds a "result to
# bool" bit); kiln reads dis's `argval`, the bare operator ("<") on every version.

# Opcodes that leave a frame or jump unconditionally: control never falls through to the next one.
NO_FALLTHROUGH = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
                            "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"})

# Jumps decided by the truth of the top of the stack: opname -> (jumps when the value is true,
# keeps the value on the stack when it jumps). 3.11 names the direction (FORWARD/BACKWARD) and has the
# *_OR_POP forms; 3.12+ has POP_JUMP_IF_* only (and 3.13 puts a TO_BOOL in front of it).
TRUTH_JUMPS = {
    "POP_JUMP_IF_TRUE": (True, False), "POP_JUMP_IF_FALSE": (False, False),
    "POP_JUMP_FORWARD_IF_TRUE": (True, False), "POP_JUMP_FORWARD_IF_FALSE": (False, False),
    "POP_JUMP_BACKWARD_IF_TRUE": (True, False), "POP_JUMP_BACKWARD_IF_FALSE": (False, False),
    "JUMP_IF_TRUE_OR_POP": (True, True), "JUMP_IF_FALSE_OR_POP": (False, True),
}

# Opcodes a compiled code object never contains: pseudo-instructions (>= 256), the instrumented and
# specialized forms CPython swaps in at run time, and interpreter internals.
_NEVER_IN_CODE = frozenset({"CACHE", "RESERVED", "EXTENDED_ARG", "INTERPRETER_EXIT", "ENTER_EXECUTOR",
                            "EXIT_INIT_CHECK"})


def opcodes():
    """Names of the opcodes that can appear in this version's code objects (what the interpreter must
    handle or refuse by name)."""
    return sorted(name for name, op in dis.opmap.items()
                  if op < 256 and not name.startswith("INSTRUMENTED_") and name not in _NEVER_IN_CODE)


def is_jump(inst):
    return inst.opcode in dis.hasjrel or inst.opcode in dis.hasjabs


def is_backward_jump(inst):
    return is_jump(inst) and inst.argval <= inst.offset


def callable_and_self(first, second, is_null):
    """The two stack slots below a call's arguments -> (callable, bound self or None)."""
    if NULL_AFTER_CALLABLE:
        return first, (None if is_null(second) else second)
    return (second, None) if is_null(first) else (first, second)


def with_null(value, null):
    """The stack slots for `value` called with no bound self (what LOAD_GLOBAL / LOAD_ATTR push
    with their low bit set, and PUSH_NULL + a callable)."""
    return [value, null] if NULL_AFTER_CALLABLE else [null, value]


def loads_method(inst):
    """Does `inst` push a callable for a call together with a NULL/self slot? (LOAD_METHOD on 3.11,
    LOAD_ATTR and LOAD_SUPER_ATTR with their low bit on 3.12+.)"""
    return inst.opname == "LOAD_METHOD" or (inst.opname in ("LOAD_ATTR", "LOAD_SUPER_ATTR")
                                            and LOAD_ATTR_METHOD_BIT and bool(inst.arg & 1))


# ---- call sites -------------------------------------------------------------------------------------
# 3.11 runs PRECALL n before each CALL n; 3.12 dropped PRECALL.
PRECALL_BEFORE_CALL = VERSION == (3, 11)

# Instructions between a call's last operand and the instruction that calls, which must stay next to it:
# KW_NAMES (3.11/3.12: sets the keyword names that the next call reads) and 3.11's PRECALL. Neither
# changes the stack as far as the call's slots go. (3.13's CALL_KW takes its names from the stack.)
CALL_PREFIXES = frozenset({"KW_NAMES", "PRECALL"})


def call_operands(inst):
    """For an instruction that calls: how many stack values lie above its two call slots (the callable
    and its NULL/self slot, ordered as callable_and_self says), else None. CALL n: its n arguments;
    CALL_KW n (3.13): the arguments and the tuple of keyword names; CALL_FUNCTION_EX: the positional
    tuple, and the keyword dict when its low bit is set."""
    name = inst.opname
    if name == "CALL":
        return inst.arg
    if name == "CALL_KW":
        return inst.arg + 1
    if name == "CALL_FUNCTION_EX":
        return 1 + (inst.arg & 1)
    return None


def call_slot_depths(operands):
    """-> (stack depth of the callable, depth of its NULL/self slot), 1 = the top, for a call with
    `operands` values above its two call slots."""
    upper, lower = operands + 1, operands + 2
    return (lower, upper) if NULL_AFTER_CALLABLE else (upper, lower)


def local_accesses(inst):
    """[("load" | "store", name), ...]: the fast locals `inst` reads and writes, in its order.
    DELETE_FAST counts as a read (it fails on an unbound local), LOAD_FAST_AND_CLEAR as a read (the
    value goes to the stack and is stored back after an inlined comprehension)."""
    name = inst.opname
    if name in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST"):
        return [("load", inst.argval)]
    if name in ("STORE_FAST", "STORE_FAST_MAYBE_NULL"):
        return [("store", inst.argval)]
    if name == "LOAD_FAST_LOAD_FAST":  # 3.13: pushes argval[0], then argval[1]
        return [("load", inst.argval[0]), ("load", inst.argval[1])]
    if name == "STORE_FAST_LOAD_FAST":  # 3.13: stores into argval[0], then pushes argval[1]
        return [("store", inst.argval[0]), ("load", inst.argval[1])]
    if name == "STORE_FAST_STORE_FAST":  # 3.13: top of stack into argval[0], the next into argval[1]
        return [("store", inst.argval[0]), ("store", inst.argval[1])]
    return []


def exception_table(code):
    """The code object's exception table: entries with start, end, target (byte offsets), depth, lasti.
    The same format on 3.11-3.13; dis keeps its parser private, so the one call to it is here."""
    return dis._parse_exception_table(code)
