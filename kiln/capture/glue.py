"""The glue of a cache entry: one generated Python function `(F, L) -> result`.

It calls the compiled graph with the inputs reloaded from their Sources, rebuilds the Python values
the frame produced (return value, or the live stack and locals at a graph break), replays side
effects, and at a break runs the breaking construct natively and tail-calls the resume function
through the runtime. Generated as Python source so KILN_LOGS=bytecode shows something readable.
"""
import collections
import functools
import inspect
import types

import torch

from kiln.capture import data_dicts, interpreter as interp, odict_order
from kiln.capture import resume
from kiln.capture.exception_copies import fresh_exception
from kiln.capture.rerun import rerun_eagerly
from kiln.capture.sources import CodeContext
from kiln.capture.tracebacks import escaping_tracebacks
from kiln.capture.variables import (CellVariable, ConstantVariable, DataDictVariable, DequeVariable, DictIterator,
                                    DictVariable, DictViewVariable, EnumerateIterator, ExitVariable, FilterIterator,
                                    MapIterator, SequenceIterator, ZipIterator,
                                    FreshObjectVariable, GeneratorVariable, GradModeExit, NativeExit, close_block, open_block,
                                    FunctionVariable, IteratorVariable, ListVariable, MethodVariable, NDArrayVariable, ObjectIterator,
                                    ObjectVariable, PartialVariable, SetVariable, SliceVariable, SymNodeVariable,
                                    TensorVariable, TupleVariable)
from kiln.capture.graph_builder import python_expr
from kiln.capture.guards import SYMPY_PRINTER_NAMES
from kiln.capture.objects import key_var
from kiln.exc import Unsupported

_LITERAL_TYPES = (int, bool, str, type(None), bytes)
_SCALAR_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool}


MUTATION_WRITERS = []  # fn(glue, container, target) -> [(format, value Variable or None)] or None (not its kind)
REBUILDERS = {}  # a Variable kind defined in its own module -> fn(glue, var) -> an expression that rebuilds it


def _make_cell(*contents):
    return types.CellType(*contents)


def _advanced(iterator, n):
    """`iterator` after n items: how a rebuilt iterator resumes where capture left it."""
    for _ in range(n):
        next(iterator)
    return iterator


def _at_index(iterator, index):
    iterator.__setstate__(index)
    return iterator


def _new_instance(cls, items):
    """An instance of a user subclass of list/tuple/dict/set/frozenset holding `items`, made past the
    subclass's own __new__/__init__/__setitem__ (they ran during capture already, or never: a rebuild
    only restores)."""
    if issubclass(cls, (tuple, frozenset)):
        return (tuple if issubclass(cls, tuple) else frozenset).__new__(cls, items)
    if issubclass(cls, set):
        obj = set.__new__(cls)
        set.update(obj, items)
        return obj
    base = list if issubclass(cls, list) else collections.OrderedDict if issubclass(cls, collections.OrderedDict) \
        else dict
    obj = base.__new__(cls)
    if base is list:
        list.extend(obj, items)
    else:
        for k, v in items.items():
            base.__setitem__(obj, k, v)
    return obj


def _user_container(cls):
    """A user's (heap) subclass of list/tuple/dict that a rebuild makes with _new_instance."""
    return cls not in (list, tuple, dict, set, frozenset) and bool(cls.__flags__ & (1 << 9)) and not hasattr(cls, "_fields") and \
        not (cls.__module__ == "collections" or cls.__module__.startswith(("torch", "transformers")))


def _primed(gen):
    """`gen` run to its first yield, whose item is dropped (a paused generator's copy: resume.resume_code)."""
    next(gen)
    return gen


def _finished_generator():
    """A new generator that has already finished (one capture ran to its end, or closed)."""
    gen = (x for x in ())
    gen.close()
    return gen


class Glue:
    def __init__(self, og):
        self.og = og
        self.ctx = CodeContext()
        self.lines = []
        self.outputs = []      # TensorVariables the graph must return, in order
        self._out_index = {}
        self._tmp = {}         # id(Variable) -> temp name
        self._alive = []       # the Variables named in _tmp, kept so their ids stay theirs
        self._n = 0
        self._deferred = []    # lines that fill objects/cells after all of them exist
        self.at_break = False  # the values are handed to a resume function (else: returned)
        self._blocks_entered = [self._enter_block(block) for block in og.native_enters]

    def const(self, obj, hint="C"):
        return self.ctx.const(obj, hint)

    def _enter_block(self, block):
        """The line that makes and enters a profiler block before the graph call; `block` is named."""
        name = self._new_tmp()
        self._tmp[id(block)] = name
        self._alive.append(block)
        return (f"{name} = {self.const(open_block, 'OPENBLOCK')}({self.const(block.cls, 'CLS')}, "
                f"{self.const(block.args, 'K')}, {self.const(block.kwargs, 'K')})")

    def _around_graph(self, call):
        """`call` (the graph call) with the profiler blocks of this frame entered before it and the
        ones whose block ended in it left after it (also when it raises)."""
        close = self.const(close_block, "CLOSEBLOCK")
        closes, unwinding = [], []
        for e in self.og.native_exits:
            fn, pre = (close, f"{self._tmp[id(e.native)]}, ") if isinstance(e, ExitVariable) else \
                (e.source.expr(self.ctx), "")
            closes.append(f"{fn}({pre}None, None, None)")
            unwinding.insert(0, f"    {fn}({pre}type(__e), __e, __e.__traceback__)")
        closed = {id(e.native) for e in self.og.native_exits if isinstance(e, ExitVariable)}
        unwinding[:0] = [f"    {close}({self._tmp[id(b)]}, type(__e), __e, __e.__traceback__)"
                         for b in reversed(self.og.native_enters) if id(b) not in closed]  # (inner blocks first)
        if not closes and not self._blocks_entered:
            return [call]
        return [*self._blocks_entered, "try:", f"    {call}", "except BaseException as __e:", *unwinding,
                "    raise", *closes]

    def _new_tmp(self):
        self._n += 1
        return f"__t{self._n}"

    def emit(self, line):
        self.lines.append(line)

    def value(self, var):
        """An expression (a temp or literal) for `var`, evaluated before any side effect is replayed."""
        if id(var) in self._tmp:
            return self._tmp[id(var)]
        if isinstance(var, ConstantVariable):
            v = var.value
            if type(v) in _LITERAL_TYPES or (type(v) is float and v == v and abs(v) != float("inf")):
                return repr(v)
            return self.const(v, "K")
        if isinstance(var, SymNodeVariable):
            expr = python_expr(self.og, var.value, self.ctx)
            if expr is None:  # computed from tensor data (an item()): the graph returns it in a tensor
                as_tensor = self.og.call_op("call_function", torch.scalar_tensor, [var],
                                            {"dtype": ConstantVariable(_SCALAR_DTYPES[var.python_type()])})
                expr = f"{self.value(as_tensor)}.item()"
            name = self._new_tmp()  # computed again from the inputs at run time, as Python would
            self._tmp[id(var)] = name
            self._alive.append(var)
            self.emit(f"{name} = {expr}")
            return name
        if isinstance(var, interp.RealCell):
            return var.source.expr(self.ctx).rsplit(".cell_contents", 1)[0]
        name = self._new_tmp()
        self._tmp[id(var)] = name
        self._alive.append(var)  # a temporary one (made to render a __dict__) must keep its id while named
        self.emit(f"{name} = {self._build(var, name)}")
        return name

    def _build(self, var, name):
        if (rebuild := REBUILDERS.get(type(var))) is not None:  # (before the kinds it may subclass)
            return rebuild(self, var)
        if isinstance(var, TensorVariable):
            if var.node.op == "placeholder" or var.data_replaced:
                return var.source.expr(self.ctx)
            if id(var) not in self._out_index:
                self._out_index[id(var)] = len(self.outputs)
                self.outputs.append(var)
            return f"__o[{self._out_index[id(var)]}]"
        if isinstance(var, ObjectVariable) and var.source is None and isinstance(var.value, BaseException):
            tbs = escaping_tracebacks(self.og, var.value)  # (what capture built of their tracebacks)
            tbs = f", {self.const(tbs, 'TBS')}" if tbs else ""
            return f"{self.const(fresh_exception, 'FRESHEXC')}({self.const(var.value, 'OBJ')}{tbs})"  # one per call
        if isinstance(var, ObjectVariable):
            return var.source.expr(self.ctx) if var.source is not None else self.const(var.value, "OBJ")
        if isinstance(var, (ListVariable, DictVariable, SetVariable)) and var.source is not None:
            return var.source.expr(self.ctx)
        if isinstance(var, DequeVariable):
            body = "[" + ", ".join(self.value(i) for i in var.items) + "]"
            return f"{self.const(collections.deque, 'DEQUE')}({body}, {var.maxlen!r})"
        if isinstance(var, ListVariable):
            body = "[" + ", ".join(self.value(i) for i in var.items) + "]"
            self._set_attributes(name, {}, DictVariable(var.attrs))
            if _user_container(var.cls):
                return f"{self.const(_new_instance, 'NEWINST')}({self.const(var.cls, 'CLS')}, {body})"
            return body if var.cls is list else f"{self.const(var.cls, 'CLS')}({body})"
        if isinstance(var, TupleVariable):
            items = ", ".join(self.value(i) for i in var.items)
            if var.cls is tuple:
                return f"({items}{',' if len(var.items) == 1 else ''})"
            if hasattr(var.cls, "_fields"):
                return f"{self.const(var.cls, 'CLS')}({items})"
            if var.attrs:  # an instance of a tuple subclass has a __dict__
                self._set_attributes(name, {}, DictVariable(var.attrs))
            body = f"({items}{',' if len(var.items) == 1 else ''})"
            if _user_container(var.cls):
                return f"{self.const(_new_instance, 'NEWINST')}({self.const(var.cls, 'CLS')}, {body})"
            return f"{self.const(var.cls, 'CLS')}({body})"
        if isinstance(var, SetVariable):
            body = "{" + ", ".join(self.value(i) for i in var.items) + "}" if var.items else "set()"
            if _user_container(var.cls):
                self._set_attributes(name, {}, DictVariable(var.attrs))
                return f"{self.const(_new_instance, 'NEWINST')}({self.const(var.cls, 'CLS')}, {body})"
            return body if var.cls is set else f"frozenset({body})"
        if isinstance(var, DataDictVariable):
            return self._data_dict(var)
        if isinstance(var, DictVariable) and odict_order.differs(var):  # built in storage order, then relinked
            links = "[" + ", ".join(self.value(key_var(k)) for k in var.items) + "]"
            return f"{self.const(odict_order.relinked, 'RELINK')}({self._dict(var, name)}, {links})"
        if isinstance(var, DictVariable):
            return self._dict(var, name)
        if isinstance(var, NDArrayVariable):
            if var.source is not None:
                return var.source.expr(self.ctx)
            return f"{self.const(NDArrayVariable.to_numpy, 'TONUMPY')}({self.value(var.tensor)}, {var.scalar})"
        if isinstance(var, SliceVariable):
            return "slice(" + ", ".join(self.value(p) for p in var.parts) + ")"
        if isinstance(var, ExitVariable) and var.restores is not None:
            return self.const(GradModeExit.restoring(var.restores), "EXIT")
        if isinstance(var, ExitVariable) and var.native is not None:
            return f"{self.const(NativeExit, 'NATIVEEXIT')}({self.value(var.native)})"
        if isinstance(var, GeneratorVariable) and var.done:
            return f"{self.const(_finished_generator, 'DONEGEN')}()"
        if isinstance(var, GeneratorVariable) and var.count == 0:
            return self._unstarted_generator(var)
        if isinstance(var, GeneratorVariable):
            if self.at_break:
                # (one a resume function would take over: it could, but torch.compile runs such a
                # frame eagerly, and kiln keeps its graph counts)
                raise Unsupported("a generator paused at a yield across a graph break")
            return self._paused_generator(var)
        if isinstance(var, ObjectIterator):
            return self.value(var.obj)
        if isinstance(var, IteratorVariable):
            return "iter([" + ", ".join(self.value(i) for i in var.items[var.pos:]) + "])"
        if isinstance(var, (SequenceIterator, DictIterator, DictViewVariable, MapIterator, ZipIterator,
                            FilterIterator, EnumerateIterator)):
            return self._lazy_iterable(var)
        if isinstance(var, CellVariable):
            if var.contents is not CellVariable._EMPTY:
                self._deferred.append(lambda: f"{name}.cell_contents = {self.value(var.contents)}")
            return f"{self.const(_make_cell, 'MAKECELL')}()"
        if isinstance(var, FreshObjectVariable):
            setter = "object.__setattr__" if var.set_attribute is object.__setattr__ else \
                self.const(var.set_attribute, "SETATTR")
            self._deferred.append(lambda: "; ".join(f"{setter}({name}, {k!r}, {self.value(v)})"
                                                    for k, v in var.attrs.items()) or "pass")
            new = "object.__new__" if var.new_instance is object.__new__ else self.const(var.new_instance, "NEW")
            return f"{new}({self.const(var.cls, 'CLS')})"
        if isinstance(var, FunctionVariable):
            defaults = self.value(var.defaults) if var.defaults is not None else "None"
            closure = "(" + "".join(self.value(c) + ", " for c in var.closure) + ")" if var.closure else "None"
            fn = (f"{self.const(types.FunctionType, 'FN')}({self.const(var.code, 'CODE')}, "
                  f"{self.const(var.f_globals, 'GD')}, {var.name.rsplit('.', 1)[-1]!r}, {defaults}, {closure})")
            fn_attrs = dict(var.slots)
            if var.kwdefaults is not None:
                fn_attrs["__kwdefaults__"] = var.kwdefaults
            if "__qualname__" not in fn_attrs and "." in var.name:
                fn_attrs["__qualname__"] = ConstantVariable(var.name)
            self._set_attributes(name, fn_attrs, var.attrs)
            return fn
        if isinstance(var, PartialVariable):
            parts = [self.value(var.func)] + [self.value(a) for a in var.args] + \
                [f"**{self.value(var.keywords)}"]
            self._set_attributes(name, {}, var.attrs)
            return f"{self.const(functools.partial, 'PARTIAL')}({', '.join(parts)})"
        if isinstance(var, MethodVariable):
            obj = self.value(var.obj)
            if isinstance(var.fn, str):
                return f"{obj}.{var.fn}"
            fn = self.value(var.fn) if isinstance(var.fn, FunctionVariable) else self.const(var.fn, "FN")
            return f"{self.const(types.MethodType, 'METHOD')}({fn}, {obj})"
        raise Unsupported(f"cannot rebuild {type(var).__name__} after a graph break")

    def _dict(self, var, name):
        """An expression for a dict (subclass) with `var`'s items, in its storage order."""
        items = odict_order.storage_items(var)
        body = "{" + ", ".join(f"{self.value(key_var(k))}: {self.value(v)}" for k, v in items.items()) + "}"
        if var.cls is dict:
            return body
        factory = getattr(var, "default_factory", None)
        if factory is not None:
            return f"{self.const(var.cls, 'CLS')}({self.value(factory)}, {body})"
        if _user_container(var.cls):
            self._set_attributes(name, {}, DictVariable(var.attrs))
            return f"{self.const(_new_instance, 'NEWINST')}({self.const(var.cls, 'CLS')}, {body})"
        return f"{self.const(var.cls, 'CLS')}({body})"

    def _lazy_iterable(self, var):
        """An iterator or dict view rebuilt as the same kind of object in the same state, over the
        rebuilt values it reads from (so a map stays a map, a list iterator stays live)."""
        if isinstance(var, DictViewVariable):
            return var.source.expr(self.ctx) if var.source is not None else f"{self.value(var.dict)}.{var.kind}()"
        if isinstance(var, SequenceIterator):
            make = "reversed" if var.reverse else "iter"
            if var.done:
                return f"{make}({'[]' if isinstance(var.seq, ListVariable) else '()'})"
            if isinstance(var.seq, ListVariable):  # an index into the live list, as CPython's
                return f"{self.const(_at_index, 'ITER')}({make}({self.value(var.seq)}), {var.index})"
            return f"{self.const(_advanced, 'ITER')}({make}({self.value(var.seq)}), {var.consumed()})"
        if isinstance(var, DictIterator):
            if var.size != len(var.dict.items):
                raise Unsupported("a dict iterator whose dict changed size")
            return f"{self.const(_advanced, 'ITER')}(iter({self.value(var.dict)}.{var.kind}()), {var.pos})"
        if isinstance(var, MapIterator):
            return f"map({self.value(var.fn)}, {', '.join(self.value(i) for i in var.iterators)})"
        if isinstance(var, ZipIterator):
            return f"zip({''.join(self.value(i) + ', ' for i in var.iterators)}strict={var.strict})"
        if isinstance(var, FilterIterator):
            return f"filter({self.value(var.fn)}, {self.value(var.iterator)})"
        return f"enumerate({self.value(var.iterator)}, {var.count})"

    def _data_dict(self, var):
        """A ModelOutput made in the frame: its state restored (data_dicts: its items as the frame left
        them, its fields as attributes), or its class called again where the class is not shown to make
        just that state."""
        fields = var.fields  # (the dataclass fields in order, then keys the frame set that are none)
        none = {k for k, v in fields.items() if isinstance(v, ConstantVariable) and v.value is None}
        names = list(fields)
        # (all fields but the first None and the first no tensor: __post_init__ reads it as a mapping)
        first_alone = not set(names[1:]) - none and not isinstance(fields[names[0]], TensorVariable)
        if all(type(k) is str and fields.get(k) is v for k, v in var.items.items()) and not first_alone \
                and all(type(k) is str for k in names) and data_dicts.restorable(var.cls, none):
            items = "".join(f"({k!r}, {self.value(v)}), " for k, v in var.items.items())
            attrs = ", ".join(f"{k!r}: {self.value(v)}" for k, v in fields.items())
            return f"{self.const(data_dicts.restore, 'RESTORE')}({self.const(var.cls, 'CLS')}, ({items}), {{{attrs}}})"
        args = ", ".join(f"{k}={self.value(v)}" for k, v in fields.items())
        return f"{self.const(var.cls, 'CLS')}({args})"

    def _set_attributes(self, name, attrs, instance_dict):
        """After all values exist: set the attributes `attrs` (name -> Variable) of the object `name`,
        and fill its __dict__ from `instance_dict` (a DictVariable), unless both are empty."""
        if attrs:
            self._deferred.append(lambda: "; ".join(f"{name}.{k} = {self.value(v)}" for k, v in attrs.items()))
        if instance_dict.items:
            self._deferred.append(lambda: f"{name}.__dict__.update({self.value(instance_dict)})")

    def _paused_generator(self, var):
        """A generator paused at a yield: a generator of a copy of its code (resume.resume_code) given
        the paused frame's stack and live locals and run to that same yield, where it waits as the
        original does; what it yields next is computed when it is asked for, as in CPython."""
        frame = var.frame
        yield_inst = frame.insts[frame.ip - 1]
        if yield_inst.opname != "YIELD_VALUE":
            raise Unsupported("a generator paused elsewhere than at a yield")
        stack = frame.stack[:-1] + [ConstantVariable(None)]  # (what the yield hands out: what `_primed` drops)
        nulls = [interp.is_null(v) for v in stack]
        live = [n for n in resume.live_locals(frame.code, yield_inst.offset) if n in frame.locals]
        code = resume.resume_code(frame.code, yield_inst.offset, nulls, live, generator=True)
        stack_names, argnames = resume.parameters(frame.code, nulls, live)
        values = dict(zip(stack_names, [v for v, null in zip(stack, nulls) if not null]))
        values.update((n, frame.locals[n]) for n in live)
        cells = "".join(self.value(frame.cells[n]) + ", " for n in code.co_freevars)
        fn = (f"{self.const(types.FunctionType, 'FN')}({self.const(code, 'CODE')}, {self.const(frame.f_globals, 'GD')}, "
              f"{frame.code.co_name!r}, None, {'(' + cells + ')' if code.co_freevars else 'None'})")
        args = ", ".join(self.value(values[n]) for n in argnames)
        return f"{self.const(_primed, 'PRIMED')}({fn}({args}))"

    def _unstarted_generator(self, var):
        """A generator not run yet (made just before a break): call its function again, natively."""
        frame, code = var.frame, var.frame.code
        cells = "".join(self.value(frame.cells[n]) + ", " for n in code.co_freevars)
        fn = (f"{self.const(types.FunctionType, 'FN')}({self.const(code, 'CODE')}, {self.const(frame.f_globals, 'GD')}, "
              f"{code.co_name!r}, None, {'(' + cells + ')' if code.co_freevars else 'None'})")
        names, nargs = code.co_varnames, code.co_argcount + code.co_kwonlyargcount
        args = [self.value(frame.locals[n]) for n in names[:code.co_argcount]]
        if code.co_flags & inspect.CO_VARARGS:
            args.append("*" + self.value(frame.locals[names[nargs]]))
        args += [f"{n}={self.value(frame.locals[n])}" for n in names[code.co_argcount:nargs]]
        if code.co_flags & inspect.CO_VARKEYWORDS:
            args.append("**" + self.value(frame.locals[names[nargs + bool(code.co_flags & inspect.CO_VARARGS)]]))
        return f"{fn}({', '.join(args)})"

    def finish_values(self):
        """Fill attributes/cells of rebuilt objects (after all exist, so cycles work)."""
        while self._deferred:
            line = self._deferred.pop(0)()
            self.emit(line)

    def replay_side_effects(self):
        """Write the final state of mutated outside objects back (values were computed first)."""
        se = self.og.side_effects
        todo = []  # (format with {} for the value, value Variable)
        for container in se.mutated:
            target = container.source.expr(self.ctx)
            written = next((w for w in (writer(self, container, target) for writer in MUTATION_WRITERS)
                            if w is not None), None)
            if written is not None:
                todo.extend(written)
            elif isinstance(container, DequeVariable):  # a deque has no slice assignment
                todo.append((f"__q = {target}; __q.clear(); __q.extend({{}})", ListVariable(container.items)))
            elif isinstance(container, ListVariable):
                todo.append((f"{target}[:] = {{}}", ListVariable(container.items)))
            elif isinstance(container, SetVariable):  # in place, so the set keeps its own table
                todo.append((f"__s = {target}; __n = {{}}; __s -= __s - __n; __s |= __n",
                             SetVariable(container.vars.items())))
            elif isinstance(container, DictVariable) and odict_order.differs(container):  # both its orders
                orders = TupleVariable([DictVariable(odict_order.storage_items(container)), DictVariable(container.items)])
                todo.append((f"{self.const(odict_order.restore, 'RESTORE')}({target}, {{}})", orders))
            else:
                todo.append((f"__d = {target}; __d.clear(); __d.update({{}})", DictVariable(container.items)))
        deletes = []
        for obj_var, name, value in se.attr_stores.values():
            if value is se.DELETED:
                deletes.append(f"delattr({self.value(obj_var)}, {name!r})")
            else:
                todo.append((f"setattr({self.value(obj_var)}, {name!r}, {{}})", value))
        for source, value in list(se.global_stores.values()) + list(se.cell_stores.values()):
            todo.append((f"{source.expr(self.ctx)} = {{}}", value))
        rendered = [(fmt, None if v is None else self.value(v)) for fmt, v in todo]
        self.finish_values()
        for fmt, v in rendered:
            self.emit(fmt if v is None else fmt.format(v))
        for line in deletes:
            self.emit(line)

    def function(self, graph_fn, input_sources, tail, rerun=False):
        """Assemble `def __kiln_entry(F, L)`; `tail` are the final lines (return / break). `rerun`:
        a graph that raises runs the frame again eagerly (rerun.py says when that may be)."""
        lines = []
        if graph_fn is not None:
            shared = _SharedBases(self.ctx, input_sources)
            args = ", ".join(s.expr(shared) for s in input_sources)
            lines += shared.lines
            call = f"__o = {self.const(graph_fn, 'GRAPH')}({args})"
            if rerun:
                lines += ["try:", f"    {call}", "except Exception as __e:",
                          f"    return {self.const(rerun_eagerly, 'RERUN')}(F, L, __e)"]
            else:
                lines += self._around_graph(call)
        else:
            lines += self._around_graph("pass")
        lines += self.lines + tail
        uses_g = any("G[" in line for line in lines)
        body = (["G = F.__globals__"] if uses_g else []) + lines
        src = "def __kiln_entry(F, L):\n" + "".join(f"    {line}\n" for line in body)
        ns = {**SYMPY_PRINTER_NAMES, **self.ctx.consts}
        exec(compile(src, "<kiln glue>", "exec"), ns)
        return ns["__kiln_entry"], src


class _SharedBases:
    """Renders the graph's input sources with each base that two or more of them read through bound
    to a local first (a model's parameters share their module paths: `...._modules['0']._modules[
    'attention']` is walked once, not once per weight). Reads as the guards read: once per call."""

    def __init__(self, ctx, sources):
        self.ctx, self.lines, self._names = ctx, [], {}
        counts = collections.Counter(base.key() for s in sources for base in _bases(s))
        self._shared = {key for key, n in counts.items() if n > 1}

    def const(self, obj, hint="C"):
        return self.ctx.const(obj, hint)

    def sub(self, source):
        key = source.key()
        if key not in self._shared:
            return source.expr(self)
        if key not in self._names:
            self._names[key] = f"__b{len(self._names)}"
            self.lines.append(f"{self._names[key]} = {source.expr(self)}")
        return self._names[key]


def _bases(source):
    """The sources `source` reads through (x and x.a for x.a.b), nearest first."""
    while (source := getattr(source, "base", None)) is not None:
        yield source
