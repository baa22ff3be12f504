"""Guards: the facts about inputs a compiled entry assumed, compiled into ONE Python function.

Each Guard is a boolean expression over `v` (the value its Source reloads). The builder hoists every
source expression into a local once, so `L[0]._modules['fc']._parameters['weight']` is walked once
per call, and emits a flat chain of `if not (...): return False` — identity and type checks first,
because they are created first.

Objects checked by identity (modules, user functions and classes) are held weakly: an entry must not
keep alive what it checks, and once such an object dies no call can pass the guard again, so the
entry's `Liveness` tells its cache to drop it.
"""
import enum
import inspect
import math
import sys
import types
import weakref

import torch

from kiln.capture import class_watch, tensor_checks
from kiln.capture.portable import code_fingerprint
from kiln.capture.sources import AttrSource, CodeContext, TupleSource

# what symbolic expressions printed as Python call: math.isnan / math.trunc, torch.sym_float, and on
# torch 2.14 torch.sym_max / sym_min (ShapeEnv guards, and numbers the glue recomputes from sizes)
SYMPY_PRINTER_NAMES = {"math": math, "torch": torch}


_SAME = object()  # GuardSet.add: the portable check is the check itself


class Guard:
    """`check` is an expression in `v`, with constants already interned in the entry's CodeContext.
    `portable` is the check another process makes (capture_cache): `check` itself, one that holds
    there too where `check` names a live object by identity, or None where there is none.
    `native`: for a tensor guard the native helper checks, (its type check, kept in place, in `v`;
    the tensor_checks spec of the rest, checked with all others in one call at the end)."""

    __slots__ = ("source", "check", "text", "portable", "native")

    def __init__(self, source, check, text, portable, native=None):
        self.source, self.check, self.text, self.portable = source, check, text, portable
        self.native = native

    def __repr__(self):
        return self.text


class GuardSet:
    """The guards of one compiled entry, in creation order, deduplicated."""

    def __init__(self):
        self.ctx = CodeContext()
        self.guards = []
        self._seen = set()
        self._classes = set()  # ids of the classes guarded unchanged
        self._tuples = {}  # (keys, their types) -> the one tuple interned for them (keys_match)
        self.liveness = Liveness()

    def add(self, source, check, text=None, portable=_SAME, native=None):
        """`check` may use `v` and names from `self.const(...)`; source None means a global-state guard.
        `portable`: what another process checks instead (see Guard), `check` itself by default;
        `native`: see Guard."""
        key = (source.key() if source is not None else None, check)
        if key in self._seen:
            return
        self._seen.add(key)
        self.guards.append(Guard(source, check, text or self._describe(source, check),
                                 check if portable is _SAME else portable, native))

    def const(self, obj, hint="C"):
        return self.ctx.const(obj, hint)

    def _interned(self, names):
        """One object for equal tuples of str/int keys, so equal checks on one source dedup into one."""
        if not all(type(k) in (str, int) for k in names):
            return names
        return self._tuples.setdefault((names, tuple(map(type, names))), names)

    def ref(self, obj, hint):
        """An expression for `obj` in a guard: a plain constant, or a call of a weak reference (None
        once `obj` has died) for objects that may die while the program runs."""
        if held_weakly(obj):
            return f"{self.const(self.liveness.ref(obj), 'W')}()"
        return self.const(obj, hint)

    def _describe(self, source, check):
        return check.replace("v", repr(source), 1) if source is not None else check

    # ---- the common guards -------------------------------------------------------------------
    def type_match(self, source, value):
        self.add(source, f"type(v) is {self.ref(type(value), 'T')}",
                 f"type({source!r}) is {type(value).__qualname__}")

    def code_match(self, source, fn):
        """`source` is a plain function running `fn`'s code, with as many defaults, over the same globals.
        Another process, where that code object is another one, checks the code's fingerprint instead
        (the same bytecode, constants, names and closure layout: it does the same)."""
        function_type = self.ref(types.FunctionType, "T")
        self.add(source, f"type(v) is {function_type} and v.__code__ is {self.ref(fn.__code__, 'CODE')} and "
                         f"{self._same_frame_shape(fn)}",
                 f"{source!r} is a function of {fn.__code__.co_qualname}", self._portable_code_match(fn))

    def _same_frame_shape(self, fn):
        return (f"v.__globals__ is {self.ref(fn.__globals__, 'GD')} and "
                f"len(v.__defaults__ or ()) == {len(fn.__defaults__ or ())} and "
                f"len(v.__kwdefaults__ or ()) == {len(fn.__kwdefaults__ or ())}")

    def _portable_code_match(self, fn):
        return (f"type(v) is {self.const(types, 'TYPES')}.FunctionType and "  # (found by module: its name is not)
                f"{self.const(code_fingerprint, 'CODEFP')}(v.__code__) == {code_fingerprint(fn.__code__)!r} and "
                f"{self._same_frame_shape(fn)}")

    def id_match(self, source, value):
        ref = self.ref(value, "ID")
        portable = f"v is {ref}"  # a module, or a function or class its module holds: found by name there
        if ref.endswith("()"):  # a dead referent reads None: `is not None` keeps a None value from passing
            ref += " is not None"
            portable = self._portable_identity(value)
        self.add(source, f"v is {ref}", f"{source!r} is {_short(value)}", portable)

    def _portable_identity(self, value):
        """What another process checks for a live object this one checks by identity (it exists in
        this process only), or None: nothing sound."""
        if isinstance(value, torch.nn.Module):
            # captured through guarded sources alone (its attributes by value, its parameters as inputs,
            # its class unchanged), so another process may check its type instead
            return f"type(v) is {self.const(type(value), 'T')}"
        if isinstance(value, enum.Enum) and not held_weakly(type(value)):  # one member of each name per class
            return f"type(v) is {self.const(type(value), 'T')} and v._name_ == {value._name_!r}"
        if type(value) is types.FunctionType and _module_globals(value):
            # a function no module holds by its name (the original inside a decorator's closure): capture
            # followed its code, and read its defaults, cells and attributes through guarded sources
            return self._portable_code_match(value)
        return None  # (a function over a namespace of its own: holding that here would keep it alive)

    def const_match(self, source, value):
        if value is None or value is True or value is False or value is Ellipsis:
            self.add(source, f"v is {value!r}", f"{source!r} is {value!r}")
        elif type(value) in (int, float, str, bytes, complex):
            self.add(source, f"type(v) is {type(value).__name__} and v == {value!r}", f"{source!r} == {value!r}")
        else:
            c = self.const(value, "K")
            check = f"type(v) is {self.ref(type(value), 'T')} and v == {c}"
            portable = _SAME
            if type(value) is types.CodeType:  # immutable: the same object is equal without a field-by-field compare
                check = f"v is {c} or ({check})"
                portable = (f"type(v) is {self.const(types, 'TYPES')}.CodeType and "  # (another process's code object)
                            f"{self.const(code_fingerprint, 'CODEFP')}(v) == {code_fingerprint(value)!r}")
            self.add(source, check, f"{source!r} == {value!r}", portable)

    def tensor_match(self, source, t, dynamic=()):
        dt, device = self.const(t.dtype, "DT"), self._device_check(t)
        grad = "v.requires_grad" if t.requires_grad else "not v.requires_grad"
        spec = tensor_checks.spec(t, dynamic)
        native = None if spec is None else (f"type(v) is {self.const(type(t), 'T')}", spec)
        if dynamic:  # sizes of dynamic dims are checked by the shape guards instead
            static = " and ".join(f"v.shape[{d}] == {n}" for d, n in enumerate(t.shape) if d not in dynamic)
            check = (f"type(v) is {self.const(type(t), 'T')} and v.dtype is {dt} and {device} and "
                     f"v.dim() == {t.dim()} and {grad} and "
                     f"v.is_contiguous() is {t.is_contiguous()}" + (f" and {static}" if static else ""))
            shape = [("*" if d in dynamic else n) for d, n in enumerate(t.shape)]
            self.add(source, check, f"{source!r}: {type(t).__name__} {str(t.dtype).replace('torch.', '')}"
                     f"{shape} (dynamic dims {sorted(dynamic)}) device={t.device} requires_grad={t.requires_grad}",
                     native=native)
            return
        size, stride = self.const(t.shape, "S"), self.const(t.stride(), "ST")
        check = (f"type(v) is {self.const(type(t), 'T')} and v.dtype is {dt} and {device} and "
                 f"v.shape == {size} and v.stride() == {stride} and {grad}")
        self.add(source, check, f"{source!r}: {type(t).__name__} {str(t.dtype).replace('torch.', '')}"
                 f"{list(t.shape)} stride={t.stride()} device={t.device} requires_grad={t.requires_grad}",
                 native=native)

    def _device_check(self, t):
        # a CPU tensor's device is always device('cpu'): the is_cpu flag says as much, ~25% cheaper per
        # tensor guard, which adds up over a model's parameters
        return "v.is_cpu" if t.device.type == "cpu" else f"v.device == {self.const(t.device, 'DEV')}"

    def in_instance_dict(self, source, name, present, text):
        """`name` is (`present`) or is not a key of the object's `__dict__`: a guard on the source of
        the `__dict__` itself, so an object checked for several names reads its `__dict__` once per
        call (a class with a Python `__getattribute__`, as Hugging Face configs have, runs it per read)."""
        self.add(AttrSource(source, "__dict__"), f"{name!r} {'in' if present else 'not in'} v", text)

    def len_match(self, source, value):
        self.add(source, f"type(v) is {self.ref(type(value), 'T')} and len(v) == {len(value)}",
                 f"type({source!r}) is {type(value).__name__} and len == {len(value)}")

    def keys_match(self, source, value):
        keys = self.const(self._interned(tuple(value.keys())), "KEYS")
        if any(isinstance(k, torch.Tensor) for k in value):  # tensor keys compare by identity, as a dict does
            same = f"len(v) == {len(value)} and all(a is b for a, b in zip(v, {keys}))"
        else:
            same = f"tuple(v) == {keys}"
            if not all(type(k) in (str, int) for k in value):  # (2, 3) == torch.Size([2, 3]): types too
                same += f" and tuple(map(type, v)) == {self.const(tuple(map(type, value)), 'KEYTYPES')}"
        self.add(source, f"type(v) is {self.ref(type(value), 'T')} and {same}",
                 f"type({source!r}) is {type(value).__name__} and keys == {list(value.keys())}")

    def storage_order_match(self, source, value):
        """An OrderedDict's storage holds its keys in the same order as at capture (it may differ from
        its own order after move_to_end; dict's own methods and a write-back depend on it)."""
        keys = tuple(dict.keys(value))
        if any(isinstance(k, torch.Tensor) for k in keys):  # (compared by identity, as a dict does)
            same = f"all(a is b for a, b in zip(dict.keys(v), {self.const(keys, 'KEYS')}))"
        elif all(a is b for a, b in zip(keys, value)):
            same = "tuple(dict.keys(v)) == tuple(v)"  # (no constant: the keys guard names them)
        else:
            same = f"tuple(dict.keys(v)) == {self.const(self._interned(keys), 'KEYS')}"
        self.add(source, same, f"{source!r} storage keys == {list(keys)}")

    def autocast_match(self):
        """The autocast state around the call: fake tensors took their dtypes from it, and code may
        branch on those (one cheap check while autocast is off, the common case)."""
        anyac = self.const(torch._C._is_any_autocast_enabled, "ANYAC")
        state = autocast_state()
        if state is None:
            self.add(None, f"not {anyac}()", "autocast is off")
        else:
            self.add(None, f"{anyac}() and {self.const(autocast_state, 'ACSTATE')}() == {self.const(state, 'AC')}",
                     f"autocast state is {state}")

    def class_unchanged(self, cls):
        """Nothing reachable through `cls` (its attributes along the MRO) changed since capture: one
        check per class covers every method, `__call__`, `__getattr__` or descriptor read through it
        (see class_watch). Built-in classes cannot change and get no guard."""
        for klass in (cls, type(cls)):  # the metaclass decides lookups on the class itself
            if id(klass) in self._classes or not class_watch.can_change(klass):
                continue
            self._classes.add(id(klass))
            if held_weakly(klass):
                self.liveness.ref(klass)  # a class made at run time: the entry goes when it dies
            self.add(None, class_watch.guard_expression(klass, self.const), f"class {klass.__qualname__} unchanged")

    def alias_pattern(self, sources, tensors):
        """Which of these input tensors share memory (and which are one object) is as now: a graph
        that writes to an input computes something else when another input aliases it."""
        pattern = alias_pattern(tensors)
        self.add(TupleSource(sources), f"{self.const(alias_pattern, 'ALIASING')}(v) == {pattern!r}",
                 f"inputs {', '.join(map(repr, sources))} alias as {pattern}")

    def aliases(self, source, other):
        self.add(source, f"v is {other.expr(self.ctx)}", f"{source!r} is {other!r}")

    def distinct(self, source, other):
        self.add(TupleSource([source, other]), "v[0] is not v[1]", f"{source!r} is not {other!r}")

    # ---- code generation --------------------------------------------------------------------
    def build(self):
        """-> (check(F, L) -> bool, first_failure(F, L) -> Guard|None, source text)."""
        src, fail_src = self.sources()
        check, failure = compile_guards(src, fail_src, {**SYMPY_PRINTER_NAMES, **self.ctx.consts})
        return check, first_failure_reporter(failure, self.guards), src

    def sources(self, portable=False):
        """The source text of `__kiln_guard` and `__kiln_guard_failure`; `portable`: of the checks
        another process makes (None when some guard has none)."""
        checks = [g.portable if portable else g.check for g in self.guards]
        if None in checks:
            return None
        hoist = _Hoisting(self)
        conds, fast_conds, natives = [], [], []
        for i, (g, check) in enumerate(zip(self.guards, checks)):
            hoist.current = i
            conds.append(check if g.source is None else _substitute_v(check, hoist.sub(g.source)))
            fast_conds.append(conds[-1])
            if g.native is not None and g.source is not None:
                # the type check stays here (what later guards read of this value assumes it); the
                # rest goes into the one native call at the end: the checks are pure reads, and a
                # guard function's answer is the conjunction of its checks, so their order is free
                fast_conds[-1] = _substitute_v(g.native[0], hoist.sub(g.source))
                natives.append((hoist.sub(g.source), g.native[1]))
        # hoisted locals are assigned right before the first guard that needs them
        body, fail_body = [], []
        for i, (cond, fast_cond) in enumerate(zip(conds, fast_conds)):
            for line in hoist.pending.pop(i, ()):
                body.append(line)
                fail_body.append(line)
            body.append(f"if not ({fast_cond}): return False")
            fail_body.append(f"if not ({cond}): return {i}")
        if natives:
            values = "".join(f"{v}, " for v, _ in natives)
            specs = self.const(tuple(spec for _, spec in natives), "TSPECS")
            body.append(f"if not {self.const(tensor_checks.check_all, 'TCHECK')}(({values}), {specs}): return False")
        prologue = ["G = F.__globals__"] if any("G[" in line for line in body) else []
        src = _fn("__kiln_guard", prologue + body + ["return True"], "False")
        fail_src = _fn("__kiln_guard_failure", prologue + fail_body + ["return None"], "-1")
        return src, fail_src


def compile_guards(src, fail_src, ns):
    """(`__kiln_guard`, a function that makes `__kiln_guard_failure` when first asked) from their sources
    over the namespace `ns`. The failure function is as long as the guard and most entries never fail
    (or fail only to report why): compiling it on first use halves the compile of a warm load."""
    exec(compile(src, "<kiln guards>", "exec"), ns)

    def failure():
        exec(compile(fail_src, "<kiln guards>", "exec"), ns)
        return ns["__kiln_guard_failure"]
    return ns["__kiln_guard"], failure


def first_failure_reporter(make_failure, guards):
    """first_failure(F, L) -> the first Guard (or its text) that fails, from `__kiln_guard_failure`
    (made by `make_failure()` on the first call)."""
    failure = None

    def first_failure(F, L):
        nonlocal failure
        if failure is None:
            failure = make_failure()
        i = failure(F, L)
        if i is None:
            return None
        return guards[i] if i >= 0 else "a guard raised while evaluating"
    return first_failure


class Liveness:
    """Weak references to the objects an entry's guards check by identity. When one dies, the
    callbacks registered with `on_death` run (once): the entry can never match again."""

    __slots__ = ("_refs", "_callbacks")

    def __init__(self):
        self._refs = {}  # id(obj) -> weak reference
        self._callbacks = []

    def ref(self, obj):
        found = self._refs.get(id(obj))
        if found is None or found() is not obj:
            found = self._refs[id(obj)] = weakref.ref(obj, self._died)
        return found

    def watches(self):
        return bool(self._refs)

    def on_death(self, callback):
        self._callbacks.append(callback)

    def _died(self, _ref):
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


def _module_globals(fn):
    """`fn` runs over a module's namespace (which lives as long as the process), not one of its own."""
    name = fn.__globals__.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    return module is not None and getattr(module, "__dict__", None) is fn.__globals__


def held_weakly(value):
    """Objects that may die while the program runs: instances (modules of the user's model), and
    functions and classes that are not attributes of their module (closures, classes made at run
    time, code exec'd into a namespace of its own). Module objects, and functions and classes their
    module holds, live as long as the process and are held plainly (cheaper to check)."""
    if isinstance(value, types.ModuleType) or not type(value).__weakrefoffset__:
        return False
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):  # (C functions of a module too)
        return not module_attribute(value)
    return True


def module_attribute(obj):
    """`obj` is what its module's attribute `obj.__qualname__` holds."""
    name, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    found = sys.modules.get(name) if isinstance(name, str) else None
    if found is None or not isinstance(qualname, str):
        return False
    for part in qualname.split("."):
        found = inspect.getattr_static(found, part, None)
        if found is None:
            return False
    return found is obj or getattr(found, "__func__", None) is obj  # a classmethod/staticmethod wrapper


class _Hoisting:
    """Renders source expressions, binding each distinct source to a local `vN` once."""

    def __init__(self, guard_set):
        self.guard_set, self.names, self.pending, self.current = guard_set, {}, {}, 0

    def const(self, obj, hint="C"):  # objects that sources reload by identity (ConstSource)
        return self.guard_set.ref(obj, hint)

    def sub(self, source):
        key = source.key()
        if key not in self.names:
            expr = source.expr(self)
            if isinstance(expr, str) and expr.isidentifier():
                return expr
            name = f"v{len(self.names)}"
            self.names[key] = name
            self.pending.setdefault(self.current, []).append(f"{name} = {expr}")
        return self.names[key]


def _substitute_v(check, v):
    import re
    return re.sub(r"\bv\b", lambda m: f"({v})" if not v.isidentifier() else v, check)


def _fn(name, lines, on_error):
    inner = "\n".join("        " + line for line in lines)
    return f"def {name}(F, L):\n    try:\n{inner}\n    except Exception:\n        return {on_error}\n"


def alias_pattern(tensors):
    """For each tensor, the index of the first tensor with the same storage (one object is one storage)."""
    first = {}
    return tuple([first.setdefault(_storage_id(t), i) for i, t in enumerate(tensors)])


# the address of the tensor's StorageImpl (one C call); older torch: the storage's data pointer
_storage_id = getattr(torch._C, "_storage_id", None) or (lambda t: t.untyped_storage().data_ptr())


def autocast_state():
    """None while autocast is off everywhere, else (device, enabled, dtype) per device and the cache flag."""
    if not torch._C._is_any_autocast_enabled():
        return None
    devices = tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda"))
    return devices + (torch.is_autocast_cache_enabled(),)


def _short(obj):
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name:
        return f"<{type(obj).__name__} {name}>"
    return f"<{type(obj).__name__} at {id(obj):#x}>"
