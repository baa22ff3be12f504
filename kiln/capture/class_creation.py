"""Classes made inside the frame: class statements, type(name, bases, ns), namedtuple(), dataclasses,
typing.NamedTuple, enums made by call.

A class is made natively during capture, once: class bodies and class factories are pure on the
values they receive, those values must be known exactly, and the globals and closure variables the
body reads are guarded (a closure variable of the frame that a class closes over may not change
afterwards). Every call of the compiled code then reuses that class, as torch.compile does; only code
comparing the classes of two calls' objects can tell.
"""
import builtins
import collections
import dataclasses
import dis
import enum
import functools
import types
import typing

from kiln.capture import interpreter as interp
from kiln.capture import objects
from kiln.capture.objects import const_value, describe
from kiln.capture.python_builtins import BUILTIN_HANDLERS
from kiln.capture.variables import (CellVariable, DictVariable, FunctionVariable, ObjectVariable, PartialVariable,
                                    TupleVariable)
from kiln.exc import Unsupported


def known_value(frame, v):
    """The Python value of an argument to a class factory; a function made in the frame becomes a real
    function (see real_function)."""
    if isinstance(v, FunctionVariable):
        return real_function(frame, v)
    if isinstance(v, TupleVariable):
        return v.cls(known_value(frame, i) for i in v.items) if v.cls is tuple else const_value(v, "a class factory argument")
    if isinstance(v, DictVariable):
        return {k: known_value(frame, i) for k, i in v.items.items()}
    return const_value(v, "a class factory argument")


def real_function(frame, fn):
    """A real function for a FunctionVariable: its closure cells become real cells holding values
    known exactly; each such cell of the frame is frozen (see CellVariable.frozen)."""
    cells = tuple(_real_cell(frame, c) for c in fn.closure or ())
    defaults = known_value(frame, fn.defaults) if fn.defaults is not None else None
    real = types.FunctionType(fn.code, fn.f_globals, fn.name.rsplit(".", 1)[-1], defaults, cells or None)
    real.__qualname__ = fn.name
    if fn.kwdefaults is not None:
        real.__kwdefaults__ = known_value(frame, fn.kwdefaults)
    real.__dict__.update({k: known_value(frame, v) for k, v in fn.attrs.items.items()})
    for name, v in fn.slots.items():
        setattr(real, name, known_value(frame, v))
    return real


def _real_cell(frame, cell):
    if isinstance(cell, interp.RealCell):
        return cell.cell
    if not isinstance(cell, CellVariable):
        raise Unsupported(f"a closure cell {describe(cell)} of a class body")
    reals = frame.og.__dict__.setdefault("real_cells", {})  # one real cell per cell of the frame
    if id(cell) not in reals:
        if cell.contents is CellVariable._EMPTY:
            real = types.CellType()
        else:
            real = types.CellType(known_value(frame, cell.contents))
        cell.frozen = True
        reals[id(cell)] = (cell, real)
    return reals[id(cell)][1]


def _guard_what_the_body_reads(frame, body):
    """Guard the globals and outer variables a class body reads while the class is made (the methods'
    own reads happen later, natively, and see the current values)."""
    for inst in dis.get_instructions(body.code):
        if inst.opname in ("LOAD_NAME", "LOAD_GLOBAL") and inst.argval in body.f_globals:
            frame.load_global(inst.argval)
        elif inst.opname in ("LOAD_CLASSDEREF", "LOAD_DEREF") and inst.argval in body.code.co_freevars:
            cell = body.closure[body.code.co_freevars.index(inst.argval)]
            if isinstance(cell, interp.RealCell):
                frame.load_cell(cell, inst.argval)


def build_class(frame, args, kwargs):
    """builtins.__build_class__(body, name, *bases, **kwds): a class statement."""
    body = args[0]
    if not isinstance(body, FunctionVariable):
        raise Unsupported(f"class body {describe(body)}")
    _guard_what_the_body_reads(frame, body)
    values = [real_function(frame, body)] + [known_value(frame, a) for a in args[1:]]
    kw = {k: known_value(frame, v) for k, v in kwargs.items()}
    return _made_natively(frame, builtins.__build_class__, values, kw)


def _made_natively(frame, factory, values, kw):
    try:
        made = factory(*values, **kw)
    except Exception as e:
        raise Unsupported(f"making a class raised {type(e).__name__}: {e}", python_exception=e) from e
    return objects.result_var(frame.og, made)


def class_factory(factory, decorator=False):
    """A library function that makes or decorates a class, run natively on known arguments; a
    `decorator` called with only options (dataclass(frozen=True)) waits for its class as a partial."""
    def handler(frame, args, kwargs):
        if decorator and not args:
            return PartialVariable(ObjectVariable(factory), [], DictVariable(kwargs))
        values = [known_value(frame, a) for a in args]
        kw = {k: known_value(frame, v) for k, v in kwargs.items()}
        return _made_natively(frame, factory, values, kw)
    return handler


def _type(frame, args, kwargs):
    if len(args) == 3:  # type(name, bases, namespace): a new class
        return class_factory(type)(frame, args, kwargs)
    return _type_of(frame, args, kwargs)


_type_of = BUILTIN_HANDLERS[type]
BUILTIN_HANDLERS[type] = _type
BUILTIN_HANDLERS[builtins.__build_class__] = build_class
for _factory in (collections.namedtuple, dataclasses.make_dataclass, typing.NamedTuple, types.new_class,
                 typing.TypedDict, typing.NewType, enum.Enum, enum.IntEnum):
    BUILTIN_HANDLERS[_factory] = class_factory(_factory)
for _decorator in (dataclasses.dataclass, functools.total_ordering, enum.unique):
    BUILTIN_HANDLERS[_decorator] = class_factory(_decorator, decorator=True)
