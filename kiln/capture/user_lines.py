"""The user's source line behind each graph node (its `stack_trace`, in torch.fx's format).

The interpreter keeps `OutputGraph.frame` at the frame it is running; a node recorded then gets the
innermost line of the user's own code in that call chain (not torch's or the standard library's).
aot carries it to the aten nodes, and the compiler to buffers and kernels (compiler/provenance).
"""
import linecache


def stack_trace(frame):
    """`  File "f.py", line 7, in forward\\n    y = x.softmax(-1)\\n` for `frame`'s current line, or None."""
    if frame is None:
        return None
    from kiln.capture.interpreter import is_user_file
    f = frame
    while f.parent is not None and not is_user_file(f.code.co_filename):
        f = f.parent
    inst = f.current
    line = inst.positions.lineno if inst is not None and inst.positions and inst.positions.lineno \
        else f.code.co_firstlineno
    text = linecache.getline(f.code.co_filename, line).strip()
    return f'  File "{f.code.co_filename}", line {line}, in {f.code.co_name}\n    {text}\n'
