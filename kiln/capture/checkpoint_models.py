"""`torch.utils.checkpoint.checkpoint(fn, *args)` in compiled code: the checkpoint runs natively, its
function compiled.

Activation checkpointing is autograd machinery (saved-tensor hooks that drop the function's
activations and a recomputation in backward), not computation to trace, so capture breaks the
graph at the call. At the break the checkpoint runs natively with `fn` replaced by `fn` run through
kiln's runtime (its own compiled frame, as any callee of a break is): the forward and the
recomputation in backward both run that compiled code, and the saved-tensor hooks see the tensors it
saves for backward, so the function's activations are dropped and recomputed as in eager.
(torch.compile instead traces the function into the surrounding graph as a region its partitioner
recomputes; here each checkpoint costs a break.)
"""
import functools

import torch.utils.checkpoint

from kiln.capture import callees
from kiln.capture.objects import BUILTIN_HANDLERS
from kiln.exc import Unsupported

_CHECKPOINT = torch.utils.checkpoint.checkpoint


def _checkpoint_breaks(frame, args, kwargs):
    raise Unsupported("torch.utils.checkpoint.checkpoint runs natively (saved-tensor hooks and a recomputation "
                      "in backward); the function it checkpoints is compiled")


def _checkpoint_with_compiled_function(caller, function, *args, **kwargs):
    return _CHECKPOINT(functools.partial(caller, function), *args, **kwargs)


def _compiled_callee(caller, f):
    if f is _CHECKPOINT:
        return functools.partial(_checkpoint_with_compiled_function, caller)
    return None


BUILTIN_HANDLERS[_CHECKPOINT] = _checkpoint_breaks
callees.CALLEE_OVERRIDES.append(_compiled_callee)
