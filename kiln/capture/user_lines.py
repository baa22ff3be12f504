"""The source lines behind each graph node (its `stack_trace`, in torch.fx's format).

The interpreter keeps `OutputGraph.frame` at the frame it is running; a node recorded then gets the
chain of interpreted calls that led to it, outermost first, leaving out torch's, kiln's and the
standard library's own frames (a model library's, such as transformers', stay: that is where the
op is written). aot carries the trace to the aten nodes, and the compiler to buffers and kernels
(compiler/provenance), whose user line is the innermost entry.
"""
import functools
import linecache
import os
import sysconfig

import torch

_SKIPPED_DIRS = tuple(os.path.dirname(p) + os.sep for p in (torch.__file__, os.path.dirname(__file__)))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
# installed packages live under the standard library's folder on many installs; they are shown
_PACKAGES = tuple({sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib")})


def _shown(filename):
    if filename.startswith(_SKIPPED_DIRS) or filename.startswith("<"):
        return False
    return not filename.startswith(_STDLIB) or filename.startswith(_PACKAGES)


def stack_trace(frame):
    """`  File "f.py", line 7, in forward\\n    y = x.softmax(-1)\\n` for each shown frame of the
    interpreted call chain ending at `frame`, outermost first; None when no frame is shown."""
    chain = []
    f = frame
    while f is not None:
        if _shown(f.code.co_filename):
            chain.append(f)
        f = f.parent
    if not chain:  # all of it is torch's (a compiled nn.Sequential): the innermost line, torch's own
        chain = [f for f in [frame] if f is not None and not f.code.co_filename.startswith("<")]
    if not chain:
        return None
    lines = []
    for f in reversed(chain):
        inst = f.current
        line = inst.positions.lineno if inst is not None and inst.positions and inst.positions.lineno \
            else f.code.co_firstlineno
        lines.append(_entry(f.code.co_filename, line, f.code.co_name))
    return "".join(lines)


@functools.lru_cache(maxsize=4096)
def _entry(filename, line, function):
    text = linecache.getline(filename, line).strip()
    return f'  File "{filename}", line {line}, in {function}\n    {text}\n'
