"""DistributedDataParallel under capture, as torch.compile treats it.

DDP's forward is bookkeeping for its C++ reducer (which parameters the backward will produce
gradients for, bucket rebuilds, buffer broadcasts, the join context) around one call of the module it
wraps. None of that is computation to trace, and some of it must run on every call, so capture never
traces DDP's forward: reaching it is a graph break, and it runs natively (torch.compile skips DDP's
file the same way), except that the module DDP wraps is compiled as `kiln.compile(module)` would
compile it, with the caller's backend. While that module compiles, DDP is the active module
(`DistributedDataParallel._get_active_ddp_module()`, set by DDP's `_inside_ddp_forward`), so the
graph is split at DDP's gradient buckets (kiln/distributed/ddp_split.py). In backward the reducer's
hooks fire on the parameters' gradient accumulators, as in eager.

The functions on DDP's forward path that reach the wrapped module run as rewritten copies
(call_sites.py) whose call sites pass through `_Resolver`; everything else they call runs natively.

FSDP2 (`fully_shard`) modules are treated alike: their forward hooks all-gather and free the sharded
parameters (collectives and storage swaps, with async work), so a call of such a module runs
`Module._call_impl` natively, hooks included, with the module's own forward compiled. Capture
breaks at the call (inside the hooks); the break runs the call this way.
"""
import functools
import types
import weakref

import torch

from kiln.capture import callees
from kiln.capture.call_sites import CannotRewrite, rewrite_calls
from kiln.capture.objects import BUILTIN_HANDLERS
from kiln.exc import Unsupported

try:
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:  # a torch built without torch.distributed
    DDP = None
try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # older torch, or no torch.distributed
    FSDPModule = None

# DDP's functions from its forward down to the call of the wrapped module (the delay-all-reduce
# path calls `self.module.forward` straight from forward)
_PATH = (DDP.forward, DDP._run_ddp_forward) if DDP is not None else ()
# modules whose calls run natively (hooks and all) around their compiled forward
_NATIVE_CALL_MODULES = tuple(cls for cls in (DDP, FSDPModule) if cls is not None)
_REWRITTEN = weakref.WeakKeyDictionary()  # Caller -> {function on _PATH: its rewritten copy}


def _ddp_forward_breaks(frame, args, kwargs):
    raise Unsupported("DistributedDataParallel.forward runs natively (the reducer's bookkeeping); "
                      "the module it wraps is compiled")


def _compiled_callee(caller, f):
    """What runs in place of `f` when a graph break or a frame running eagerly calls it: a DDP or FSDP2
    module (or DDP's own forward) runs natively with the module's forward, or the module DDP wraps,
    compiled; None for anything else."""
    if isinstance(f, _NATIVE_CALL_MODULES) and type(f).__call__ is torch.nn.Module.__call__ and \
            getattr(f, "_compiled_call_impl", None) is None:
        return types.MethodType(_rewritten(caller, torch.nn.Module._call_impl), f)
    if isinstance(f, types.MethodType) and f.__func__ in _PATH:
        return types.MethodType(_rewritten(caller, f.__func__), f.__self__)
    return None


def _rewritten(caller, fn):
    """`fn` with its call sites resolved by `_Resolver(caller)` (fn itself if it cannot be rewritten)."""
    copies = _REWRITTEN.get(caller)
    if copies is None:
        copies = _REWRITTEN.setdefault(caller, {})
    found = copies.get(fn)
    if found is None:
        try:
            code = rewrite_calls(fn.__code__, _Resolver(caller))
        except CannotRewrite:
            code = fn.__code__
        found = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        found.__kwdefaults__ = fn.__kwdefaults__
        copies[fn] = found
    return found


class _Resolver:
    """The call sites of DDP's forward path and of `Module._call_impl` for DDP and FSDP2 modules: the
    wrapped module, or the module's own forward, is called compiled; DDP's own path continues
    rewritten; everything else (the reducer, FSDP's hooks, profiler ranges, torch) runs natively."""

    def __init__(self, caller):
        self.caller = weakref.ref(caller)  # the caller owns the copies that hold this resolver

    def __call__(self, f):
        caller = self.caller()
        if caller is None:
            return f
        if isinstance(f, types.MethodType) and f.__func__ in _PATH:
            return types.MethodType(_rewritten(caller, f.__func__), f.__self__)
        if isinstance(f, _NATIVE_CALL_MODULES):
            return _compiled_callee(caller, f) or f
        if isinstance(f, torch.nn.Module):
            return _compiled_module_call(caller, f)
        if isinstance(f, types.MethodType) and isinstance(f.__self__, torch.nn.Module) and \
                f.__func__ is getattr(type(f.__self__), "forward", None) and isinstance(f.__func__, types.FunctionType):
            # a module's own forward (`_call_impl` calling it, or DDP's `self.module.forward(...)`):
            # compiled as a frame of its own, torch's modules' too (torch.compile compiles their frames)
            return functools.partial(caller.call_function, f.__func__, f.__self__)
        return f


def _compiled_module_call(caller, mod):
    """`mod(...)` as `kiln.compile(mod)` runs it: one frame calling the module (hooks included),
    captured with the caller's backend; a module compiled already (kiln's or torch's wrapper) runs as it is."""
    if type(mod).__call__ is not torch.nn.Module.__call__ or getattr(mod, "_compiled_call_impl", None) is not None \
            or "_compiled_call" in mod.__dict__:
        return mod
    return functools.partial(caller.call_function, callees.synthetic_caller(mod))


if DDP is not None:
    BUILTIN_HANDLERS[DDP.forward] = _ddp_forward_breaks
    callees.CALLEE_OVERRIDES.append(_compiled_callee)
