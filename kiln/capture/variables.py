"""The values the symbolic interpreter pushes on its stack.

A small set on purpose:
  TensorVariable    a tensor: its fx node and fake tensor
  ConstantVariable  an immutable Python value known at capture time (int, str, None, torch.Size, dtype...)
  ObjectVariable    an existing Python object known by identity (module, function, class, user object)
  ListVariable / TupleVariable / DictVariable / SetVariable   containers with symbolic items
  FunctionVariable  a function made inside the frame (MAKE_FUNCTION): code + defaults + cells
  MethodVariable    a function bound to a symbolic self
  FreshObjectVariable   a user-class instance created inside the frame
  CellVariable, SuperVariable, GradModeVariable, NullVariable
  BaseIterator and its kinds (IteratorVariable, SequenceIterator, DictIterator, MapIterator, ...),
  DictViewVariable  iterators and dict views, lazy and live as CPython's
Values that came from outside carry a Source; see sources.py.
"""
import collections
import re
import types

import torch

from kiln.exc import Unsupported


_CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented),
                   torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size, range, slice,
                   frozenset, types.CodeType, re.Pattern, re.Match)


def is_constant(value):
    """Immutable values safe to fold at capture time (tuples/frozensets of such count too)."""
    if isinstance(value, (tuple, frozenset)) and type(value) in (tuple, frozenset, torch.Size):
        return all(is_constant(v) for v in value)
    if isinstance(value, slice):
        return is_constant(value.start) and is_constant(value.stop) and is_constant(value.step)
    return type(value) in _CONSTANT_TYPES or (isinstance(value, (int, float, str)) and type(value).__module__ == "builtins")


class Variable:
    source = None

    def python_type(self):
        raise NotImplementedError

    def is_constant(self):
        return False

    def __repr__(self):
        return f"{type(self).__name__}({self.source!r})" if self.source else type(self).__name__


class HandlerVariable(Variable):
    """A value that answers its own attribute reads, writes and method calls (an autograd.Function's
    ctx): objects.getattr_var, setattr_var and call_method hand those to it."""

    def var_getattr(self, frame, name):
        raise Unsupported(f"attribute {name!r} of {type(self).__name__}")

    def var_setattr(self, frame, name, value):
        raise Unsupported(f"setting attribute {name!r} of {type(self).__name__}")

    def call_method(self, frame, name, args, kwargs):
        raise Unsupported(f"method {name} of {type(self).__name__}")


class NullVariable(Variable):
    """The NULL slot of a call with no bound self (PUSH_NULL, LOAD_GLOBAL / LOAD_ATTR with the low bit);
    below the callable on 3.11/3.12, above it on 3.13 (bytecode_facts.NULL_AFTER_CALLABLE)."""

    def python_type(self):
        return type(None)


NULL = NullVariable()


class ConstantVariable(Variable):
    def __init__(self, value, source=None):
        self.value, self.source = value, source

    def python_type(self):
        return type(self.value)

    def is_constant(self):
        return True

    def __repr__(self):
        return f"Const({self.value!r})"


def const(value):
    return ConstantVariable(value)


class ObjectVariable(Variable):
    """An existing object, used by identity: modules, functions, classes, Python modules, user objects.

    `opaque`: only the object's type is guarded (a user object passed in), so its contents may differ
    on the next call and must not be folded into the graph as a whole (str(obj), obj == k)."""

    def __init__(self, value, source=None, opaque=False):
        self.value, self.source, self.opaque = value, source, opaque

    def python_type(self):
        return type(self.value)

    def __repr__(self):
        return f"Object({type(self.value).__name__} {self.source!r})"


class RuntimeFunctionVariable(ObjectVariable):
    """A plain Python function the program made at run time (a closure, a lambda; no attributes of its
    own), reached through a source. Guarded by its code and globals, not by which object it is, so a new
    closure each call reuses the graph: a call reads its defaults and closure cells through the source,
    each guarded as it is read. Whatever reads `.value` may depend on which object it is (`is`, id(),
    a native call): that read guards the identity too (`guard_identity`, run once)."""

    def __init__(self, fn, source, guard_identity):
        self.fn, self.source, self.opaque = fn, source, False
        self._guard_identity = guard_identity

    @property
    def value(self):
        if self._guard_identity is not None:
            guard, self._guard_identity = self._guard_identity, None
            guard()
        return self.fn

    def python_type(self):
        return types.FunctionType


class TensorVariable(Variable):
    data_replaced = False  # its .data was assigned in the frame: `node` is the new data, `source` the object

    def __init__(self, node, fake, source=None, cls=torch.Tensor):
        self.node, self.fake, self.source, self.cls = node, fake, source, cls

    def python_type(self):
        return self.cls

    def __repr__(self):
        return f"Tensor({self.node.name}, {tuple(self.fake.shape)})"


class NDArrayVariable(Variable):
    """A NumPy ndarray, traced through torch (numpy_support.py): `tensor` holds its data in the graph.
    `scalar`: a 0-d result NumPy hands out as a scalar (np.sum(a) is a np.float64). `source`: an
    ndarray that came from outside."""

    def __init__(self, tensor, scalar=False, source=None):
        self.tensor, self.scalar, self.source = tensor, scalar, source

    def python_type(self):
        import numpy
        return numpy.ndarray

    @staticmethod
    def to_numpy(tensor, scalar):
        """The ndarray (or NumPy scalar) a graph output stands for."""
        array = tensor.detach().numpy()
        return array[()] if scalar else array


class SymNodeVariable(Variable):
    """A symbolic number (SymInt, SymFloat or SymBool) in the graph: a dynamic size, a number input
    made symbolic, an item() under capture_scalar_outputs, or arithmetic on those."""

    def __init__(self, node, value):
        self.node, self.value = node, value

    def python_type(self):
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(self.value)]

    def __repr__(self):
        return f"Sym({self.value})"


class _Sequence(Variable):
    mutated = False

    def __init__(self, items, source=None):
        self.items, self.source = list(items), source
        self.attrs = {}  # the __dict__ of an instance of a list/tuple subclass

    def is_constant(self):
        return all(i.is_constant() for i in self.items)


class ListVariable(_Sequence):
    """A list (or a list subclass `cls`); `source` set when it is an existing list (mutations are
    replayed onto it)."""
    mutated = False

    def __init__(self, items, source=None, cls=list):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def is_constant(self):
        return False


class DequeVariable(ListVariable):
    """A collections.deque: a list whose ends are bounded by `maxlen` (None: unbounded)."""

    def __init__(self, items, source=None, maxlen=None):
        super().__init__(items, source, cls=collections.deque)
        self.maxlen = maxlen


class TupleVariable(_Sequence):
    """A tuple, or a namedtuple/torch.return_types when `cls` says so."""

    def __init__(self, items, source=None, cls=tuple):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls


class SetVariable(Variable):
    """A set. `keys` is a real Python set of the items' keys (objects.set_key), updated by every
    operation as the program updates its own set, so iteration follows CPython's hash order rather
    than insertion order; `vars` maps each key to its item's Variable. `source`: an existing set."""
    mutated = False

    def __init__(self, keyed=(), source=None, keys=None):
        """`keyed`: (key, Variable) pairs, added in order; or, with `keys` (a real set, kept in its
        own order), the Variable of each of its keys."""
        self.source = source
        self.attrs = {}
        if keys is None:
            self.keys, self.vars = set(), {}
            for key, var in keyed:
                self.add(key, var)
        else:
            self.keys, self.vars = keys, dict(keyed)

    # how often capture has read some set's iteration order: it follows the process's string hashing
    # (PYTHONHASHSEED), so an entry that read one is not stored for another process (capture_cache)
    order_reads = 0

    @property
    def items(self):
        SetVariable.order_reads += 1
        return [self.vars[k] for k in self.keys]

    def add(self, key, var):
        if key not in self.keys:
            self.keys.add(key)
            self.vars[key] = var

    def discard(self, key):
        self.keys.discard(key)
        self.vars.pop(key, None)

    def clear(self):
        self.keys.clear()
        self.vars.clear()

    cls = set  # frozenset for a frozenset with items capture does not know exactly

    def is_constant(self):
        return all(v.is_constant() for v in self.vars.values())

    def python_type(self):
        return self.cls


class SliceVariable(Variable):
    """A slice with a symbolic size among its bounds (`x[:, :n]` with n dynamic); constant slices are
    ConstantVariables. `parts` are the start, stop and step Variables."""

    def __init__(self, parts):
        self.parts = list(parts)

    def python_type(self):
        return slice


class VariableKey:
    """A dict key that is a Variable rather than a constant, hashed and compared by identity."""
    __slots__ = ("var",)

    def __init__(self, var):
        self.var = var

    def __hash__(self):
        return id(self.var)

    def __eq__(self, other):
        return type(other) is type(self) and other.var is self.var

    def __repr__(self):
        return f"{type(self).__name__}({self.var!r})"


class TensorKey(VariableKey):
    """A tensor used as a dict key: hashed and compared by identity, as torch.Tensor is."""
    __slots__ = ()

    def __hash__(self):
        return id(self.var.fake)

    def __eq__(self, other):
        return isinstance(other, TensorKey) and other.var.fake is self.var.fake


class DictVariable(Variable):
    """A dict (insertion ordered); `cls` may be OrderedDict or a dict subclass. Keys are the Python
    values of constant keys, or a TensorKey for a tensor."""
    mutated = False

    def __init__(self, items, source=None, cls=dict):
        self.items, self.source, self.cls = dict(items), source, cls
        self.attrs = {}  # the __dict__ of an instance of a dict subclass

    def python_type(self):
        return self.cls


class DataDictVariable(DictVariable):
    """A new instance of a dataclass that is also a dict (transformers' ModelOutput): keys are the fields
    that are not None, and every field is also an attribute. Rebuilt as `cls(**fields)`."""

    def __init__(self, cls, fields):
        super().__init__({k: v for k, v in fields.items() if not (isinstance(v, ConstantVariable) and v.value is None)},
                         cls=cls)
        self.fields = fields


class FunctionVariable(Variable):
    """A function object created during capture by MAKE_FUNCTION. `attrs`: its __dict__ (set by
    `f.x = ...` or functools.wraps); `slots`: the function attributes the code reassigned (__name__,
    __doc__, __annotations__, ...)."""

    def __init__(self, code, f_globals, name, defaults=None, kwdefaults=None, closure=None, annotations=None):
        self.code, self.f_globals, self.name = code, f_globals, name
        self.defaults = defaults  # TupleVariable or None
        self.kwdefaults = kwdefaults  # DictVariable or None
        self.closure = closure  # list of CellVariable / real cells, or None
        self.attrs = DictVariable({})
        self.slots = {} if annotations is None else {"__annotations__": annotations}

    def python_type(self):
        return types.FunctionType


class PartialVariable(Variable):
    """functools.partial(func, *args, **keywords) made during capture; `attrs` is its __dict__."""

    def __init__(self, func, args, keywords):
        self.func, self.args, self.keywords = func, list(args), keywords  # keywords: a DictVariable
        self.attrs = DictVariable({})

    def python_type(self):
        import functools
        return functools.partial


class MethodVariable(Variable):
    """`fn` bound to `obj` (fn: a Python function, a FunctionVariable, or a tensor method name)."""

    def __init__(self, fn, obj):
        self.fn, self.obj = fn, obj

    def python_type(self):
        return types.MethodType if not isinstance(self.obj, TensorVariable) else types.BuiltinMethodType


class FreshObjectVariable(Variable):
    """An instance of a user class created inside the frame; attributes tracked symbolically."""
    # how the glue builds it after the graph (fresh_modules overrides them for nn.Module): a new
    # instance, then each attribute in `attrs` set through `set_attribute`
    new_instance = staticmethod(object.__new__)
    set_attribute = staticmethod(object.__setattr__)

    def __init__(self, cls):
        self.cls, self.attrs = cls, {}

    def python_type(self):
        return self.cls


class RealCell:
    """A closure cell that exists outside the capture: reads are guarded, writes are side effects."""

    def __init__(self, cell, source):
        self.cell, self.source = cell, source


class CellVariable(Variable):
    """A closure cell created inside the frame (MAKE_CELL or a new function's closure). `frozen`: a
    class made natively during capture closes over it (class_creation.py), so it may not change."""
    _EMPTY = object()

    def __init__(self, contents=_EMPTY):
        self.contents = contents
        self.frozen = False

    def python_type(self):
        return types.CellType


class BaseIterator(Variable):
    """An iterator. Iterators are stateful and lazy, as CPython's are: each is stepped by
    `objects.iter_next(frame, it)` (the next item's Variable, or None once exhausted), so whatever
    an item costs (a call of map's function, a generator's body) happens when it is consumed."""


class IteratorVariable(BaseIterator):
    """An iterator over items fixed when it was made (a set's, itertools' results); `cls` is the
    Python type it stands for. Rebuilt as an iterator over the remaining items."""

    def __init__(self, items, cls=type(iter([]))):
        self.items, self.pos, self.cls = list(items), 0, cls

    def python_type(self):
        return self.cls

    def next(self):
        if self.pos >= len(self.items):
            return None
        self.pos += 1
        return self.items[self.pos - 1]


class ObjectIterator(BaseIterator):
    """An iterator object of the user's (its class defines __next__ in Python, often `__iter__` returns
    self): each step calls its __next__ until that raises StopIteration. Rebuilt as the object."""

    def __init__(self, obj):
        self.obj, self.done = obj, False

    def python_type(self):
        return self.obj.python_type()


class SequenceIterator(BaseIterator):
    """`iter(seq)` / `reversed(seq)` over a list, tuple or constant sequence (range, str, ...), as
    CPython's list_iterator, range_iterator etc.: an index into the live sequence, so items appended
    to a list while it is iterated are seen. `index` is the next position (counting down when
    reversed); `done` once exhausted (CPython drops the sequence then)."""

    def __init__(self, seq, reverse=False, length=0):
        self.seq, self.reverse, self.done = seq, reverse, False
        self.start = length - 1 if reverse else 0
        self.index = self.start

    def consumed(self):
        return self.start - self.index if self.reverse else self.index

    def python_type(self):
        example = self.seq.value if isinstance(self.seq, ConstantVariable) else \
            [] if isinstance(self.seq, ListVariable) else ()
        return type(reversed(example)) if self.reverse else type(iter(example))


class DictIterator(BaseIterator):
    """`iter(d)`, `iter(d.values())`, `iter(d.items())`: position `pos` in the live dict; CPython
    raises RuntimeError when the dict changes size while iterated, so this remembers `size`."""

    def __init__(self, dict_var, kind):
        self.dict, self.kind, self.pos, self.size = dict_var, kind, 0, len(dict_var.items)

    def python_type(self):
        return type(iter(getattr({}, self.kind)()))


class DictViewVariable(Variable):
    """`d.keys()`, `d.values()`, `d.items()`: a live view of the DictVariable `dict` (`kind` is the
    method name), so a later `d[k] = v` shows in it as in CPython. `source`: where an existing view
    (an argument) is reloaded from; its dict is the view's read-only `mapping`."""

    def __init__(self, dict_var, kind, source=None):
        self.dict, self.kind, self.source = dict_var, kind, source

    def python_type(self):
        return type(getattr({}, self.kind)())


class MapIterator(BaseIterator):
    """`map(fn, *iterators)`: calls fn only when an item is consumed."""

    def __init__(self, fn, iterators):
        self.fn, self.iterators = fn, iterators

    def python_type(self):
        return map


class ZipIterator(BaseIterator):
    """`zip(*iterators, strict=...)`: takes one item from each iterator in turn, stopping at the
    first exhausted one (the iterators after it are not advanced)."""

    def __init__(self, iterators, strict=False):
        self.iterators, self.strict = iterators, strict

    def python_type(self):
        return zip


class FilterIterator(BaseIterator):
    """`filter(fn, iterator)` (fn None: by truth)."""

    def __init__(self, fn, iterator):
        self.fn, self.iterator = fn, iterator

    def python_type(self):
        return filter


class EnumerateIterator(BaseIterator):
    """`enumerate(iterator, start)`; `count` is the next index."""

    def __init__(self, iterator, count):
        self.iterator, self.count = iterator, count

    def python_type(self):
        return enumerate


def stop_iteration_error(exc):
    """PEP 479: a StopIteration raised inside a generator's body comes out of the generator as this
    RuntimeError, the StopIteration its cause and context (CPython's words and chaining)."""
    error = RuntimeError("generator raised StopIteration")
    error.__cause__ = exc  # (also sets __suppress_context__, as CPython's conversion does)
    error.__context__ = exc
    return error


class GeneratorVariable(BaseIterator):
    """A generator made during capture by calling a generator function. Its frame runs lazily, to the
    next yield on each `next()`, so its side effects interleave with its consumer's as in CPython.
    `return_value`: what the frame returned, once done (StopIteration's value)."""
    MAX_ITEMS = 100_000

    def __init__(self, frame):
        self.frame, self.done, self.count, self.return_value = frame, False, 0, ConstantVariable(None)

    def python_type(self):
        return types.GeneratorType

    def next(self, sent=None, thrown=None):
        """Resume to the next yield: the yielded Variable, or None once the generator has returned.
        `sent`: the value the paused yield evaluates to (send); `thrown`: an exception raised there
        (throw, close). An exception leaving the frame ends the generator, as in CPython."""
        if self.done:
            return None
        self.count += 1
        if self.count > self.MAX_ITEMS:
            raise Unsupported("generator yields too many values")
        try:
            item = self.frame.resume_generator(sent, thrown)
        except Unsupported as e:
            self.done = True
            if isinstance(e.python_exception, StopIteration):  # PEP 479, where 3.11 applies it: leaving the frame
                raise Unsupported("generator raised StopIteration",
                                  python_exception=stop_iteration_error(e.python_exception)) from e
            raise
        if item is None:
            self.done, self.return_value = True, self.frame.returned
        return item


class SuperVariable(Variable):
    def __init__(self, cls, obj):
        self.cls, self.obj = cls, obj

    def python_type(self):
        return super


class GradModeVariable(Variable):
    """torch.no_grad() / enable_grad() / set_grad_enabled(b) as a context manager. set_grad_enabled
    switches at construction (as torch's does); `prior` is the mode its exit restores. `entered_from`:
    the mode a no_grad()/enable_grad() object was last entered in (its __enter__ saves it as `prev`)."""

    def __init__(self, enabled, cls, prior=None, source=None, value=None):
        self.enabled, self.cls, self.prior = enabled, cls, prior
        self.entered_from = None
        self.source, self.value = source, value  # an object from outside the frame: where, and which

    def python_type(self):
        return self.cls


class AutocastVariable(Variable):
    """torch.autocast(...) (not entered yet); `mode_args` are _enter_autocast's arguments."""

    def __init__(self, mode_args, cls):
        self.mode_args, self.cls = mode_args, cls

    def python_type(self):
        return self.cls


class GradModeExit:
    """The __exit__ of a grad-mode block that a graph break cut in two: the glue hands it to the resume
    function, which calls it where the block ends (or on an exception) to restore the mode the block
    found. One instance per mode, so capture (which follows the call) can guard it by identity."""
    _instances = {}

    def __init__(self, mode):
        self.mode = mode

    @classmethod
    def restoring(cls, mode):
        return cls._instances.setdefault(mode, cls(mode))

    def __call__(self, *exc_info):
        torch._C._set_grad_enabled(self.mode)
        return None  # falsy: an exception propagates, as with torch.no_grad()


class ExitVariable(Variable):
    """The bound __exit__ that BEFORE_WITH pushes for a grad-mode or autocast block; calling it runs
    `on_exit` (restores grad mode / leaves autocast, in the graph and in capture's own state).
    `restores`: for a grad-mode block, the mode its exit restores (a break inside such a block hands
    the resume function a real exit that restores it); None for autocast."""

    def __init__(self, on_exit, restores=None, native=None):
        self.on_exit, self.restores, self.native = on_exit, restores, native  # native: a NativeBlockVariable

    def python_type(self):
        return types.MethodType


class NativeBlockVariable(Variable):
    """A profiler block made in the frame (torch.profiler.profile(...), record_function(name)): made
    and entered natively by the glue before the graph call, and left after the graph call in which
    its block ends, so the profiler records the graph without cutting it (profiler_blocks.py).
    `args`/`kwargs`: its constructor's constant arguments."""

    def __init__(self, cls, args, kwargs):
        self.cls, self.args, self.kwargs = cls, args, kwargs

    def python_type(self):
        return self.cls


class NativeExit:
    """The exit of a profiler block that a graph break cut in two: the glue hands it to the resume
    function, which calls it where the block ends (or on an exception)."""

    def __init__(self, block):
        self.block = block

    def __call__(self, *exc_info):
        return close_block(self.block, *exc_info)


def open_block(cls, args, kwargs):
    """cls(*args, **kwargs), entered (the glue, before the graph call). A profiler label is entered only
    while a profiler runs: it records nothing otherwise, and entering one costs an op call."""
    block = cls(*args, **kwargs)
    if cls is not torch.autograd.profiler.record_function or torch.autograd._profiler_enabled():
        block.__enter__()
    return block


def close_block(block, *exc_info):
    if type(block) is torch.autograd.profiler.record_function and block.record is None:
        return None  # a label open_block did not enter
    return block.__exit__(*exc_info)

