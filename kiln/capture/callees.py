"""What the runtime calls in the place of a compiled module or a library callable, kept below the
runtime so that the modules modelling libraries (distributed_models, checkpoint_models) register
into it without importing the runtime.

- `synthetic_caller(target)`: the function a compiled module or callable is compiled as.
- `CALLEE_OVERRIDES`: library callables that run natively but whose calls into the program still
  compile (DDP's forward).
"""
import types

from kiln.capture.identity_table import IdentityTable


def synthetic_caller(target):
    """A fresh function `(*args, **kwargs) -> target(*args, **kwargs)`, `target` a global of its own
    namespace. Its code object is one per target (by identity: these code objects all compare equal),
    so each compiled module/callable has a cache of its own, kept while the target lives."""
    ns = {"__kiln_target__": target, "__builtins__": __builtins__}
    return types.FunctionType(_caller_code(target), ns, "__kiln_call__")


_CALLER_CODES = IdentityTable()  # target -> its synthetic caller's code object (which does not refer to it)


def _caller_code(target):
    def make():
        src = "def __kiln_call__(*args, **kwargs):\n    return __kiln_target__(*args, **kwargs)\n"
        module = compile(src, f"<kiln call {type(target).__name__} {id(target):#x}>", "exec")
        return next(c for c in module.co_consts if isinstance(c, types.CodeType))
    try:
        return _CALLER_CODES.setdefault(target, make)
    except TypeError:  # not weakly referenceable: a code object per compile
        return make()


# Library callables that run natively but whose calls into the program still compile (DDP's
# forward): functions (caller, f) -> what to call in f's place, or None; modules that model such a
# library append theirs (distributed_models).
CALLEE_OVERRIDES = []


def overridden_callee(caller, f):
    for override in CALLEE_OVERRIDES:
        found = override(caller, f)
        if found is not None:
            return found
    return None
