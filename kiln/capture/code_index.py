"""A code object's instructions by offset (light: resume functions are rebuilt from it in a process that
loads a frame from the capture cache without the interpreter)."""
import dis


def instructions(code):
    """-> (instructions without EXTENDED_ARG, offset -> index). A jump may target an EXTENDED_ARG
    prefix, so those offsets map to the instruction they extend."""
    insts, index_of, pending = [], {}, []
    for i in dis.get_instructions(code):
        if i.opname == "EXTENDED_ARG":
            pending.append(i.offset)
            continue
        for off in pending + [i.offset]:
            index_of[off] = len(insts)
        pending = []
        insts.append(i)
    return insts, index_of
