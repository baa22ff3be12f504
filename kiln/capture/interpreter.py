"""The symbolic interpreter: one handler per CPython opcode (3.11, 3.12, 3.13), over Variables instead of values.

`Frame` runs one code object (the captured frame, or an inlined callee sharing its OutputGraph).
Python semantics of calls, attributes and iteration live in `objects.py`; this file is only the
instruction loop and the stack discipline. What differs between CPython versions (where a call's
NULL sits, what FOR_ITER skips, ...) is asked of `bytecode_facts`, never of `sys.version_info` here.
"""
import builtins
import inspect
import linecache
import operator
import sys

import torch

from kiln.capture import bytecode_facts as facts
from kiln.capture import data_scalars, objects, tracebacks
from kiln.capture.code_index import instructions
from kiln.capture.identity_table import IdentityTable
from kiln.capture.sources import CellSource, GlobalSource, LocalSource
from kiln.capture.user_files import is_user_file
from kiln.capture.variables import (NULL, AutocastVariable, Variable, BaseIterator, CellVariable, ConstantVariable, DictVariable,
                                    ExitVariable,
                                    FreshObjectVariable, FunctionVariable, GeneratorVariable, GradModeVariable,
                                    ListVariable, NativeBlockVariable,
                                    NullVariable, ObjectVariable, RealCell, SliceVariable, SymNodeVariable,
                                    TensorVariable, TupleVariable, const, stop_iteration_error)
from kiln.exc import Unsupported

BINARY_OPS = [operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul, operator.mul,
              operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub, operator.truediv,
              operator.xor, operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
              operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub,
              operator.itruediv, operator.ixor]
COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
               ">=": operator.ge}
UNARY_OPS = {"UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos, "UNARY_INVERT": operator.invert,
             "UNARY_NOT": operator.not_}
# Opcodes capture refuses, and why (the message of the graph break they cause); everything else in
# bytecode_facts.opcodes() has a handler below.
NOT_CAPTURED = {
    "LOAD_BUILD_CLASS": "a class statement", "LOAD_NAME": "module- or class-level code",
    "STORE_NAME": "module- or class-level code", "DELETE_NAME": "module- or class-level code",
    "SETUP_ANNOTATIONS": "module- or class-level code", "IMPORT_STAR": "`from module import *`",
    "PRINT_EXPR": "interactive-mode code", "LOAD_LOCALS": "a class body",
    "LOAD_FROM_DICT_OR_GLOBALS": "a class body or annotation scope",
    "LOAD_FROM_DICT_OR_DEREF": "a class body or annotation scope",
    "DELETE_GLOBAL": "del of a global", "DELETE_DEREF": "del of a closure variable",
    "MATCH_CLASS": "a class pattern in a match statement",
    "CHECK_EG_MATCH": "except* (exception groups)", "PREP_RERAISE_STAR": "except* (exception groups)",
    "ASYNC_GEN_WRAP": "an async generator", "BEFORE_ASYNC_WITH": "async with", "END_ASYNC_FOR": "async for",
    "GET_AITER": "async for", "GET_ANEXT": "async for", "GET_AWAITABLE": "await",
}
MAX_INLINE_DEPTH = 60
MAX_STEPS = 2_000_000


class _Instructions:
    """A code object's instructions, with offset -> index; cached per code object, while it lives."""
    _cache = IdentityTable()

    @classmethod
    def of(cls, code):
        return cls._cache.setdefault(code, lambda: instructions(code))


_EXCEPTION_TABLES = IdentityTable()  # code -> its parsed exception table
ON_RETURN = []  # hooks (frame, returned Variable) run as a frame that made generators returns (generator_models)


class _Yielded:
    """What a generator frame's run() returns when it stops at a yield."""

    def __init__(self, value):
        self.value = value


class _LazyArg:
    """A root-frame argument not wrapped yet: only arguments the code reads get guards."""

    def __init__(self, index, name, value):
        self.index, self.name, self.value = index, name, value


class Frame:
    def __init__(self, capture, code, f_globals, local_values, cells, parent=None, root_globals=False):
        self.capture, self.og = capture, capture.og
        self.code, self.f_globals, self.parent = code, f_globals, parent
        self.root_globals = root_globals
        self.locals = local_values  # name -> Variable | _LazyArg
        self.cells = cells          # name -> CellVariable | RealCell
        self.stack = []
        self.insts, self.index_of = _Instructions.of(code)
        self.ip = 0
        self.kw_names = None
        self.depth = 0 if parent is None else parent.depth + 1
        self.is_generator = bool(code.co_flags & inspect.CO_GENERATOR)
        self.thrown, self.returned = None, None  # a generator frame: exception to raise on resuming; return value
        self.made_generators = []  # generators this frame made by calling generator functions
        self.exc_info = None  # the exception an except block of this frame is handling (bare `raise`, __context__)
        self.current = None
        if self.depth > MAX_INLINE_DEPTH:
            raise Unsupported("inlining depth limit reached (recursion?)", kind="capture_limit")

    def inline_call(self, fn_code, f_globals, args, kwargs, defaults, kwdefaults, closure_cells):
        """Run a Python function's code inside the current capture, called from this frame; returns its
        result Variable. (objects.call reaches the interpreter through the frame it is given.)"""
        flags = fn_code.co_flags
        if flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE):
            raise Unsupported(f"calling async function {fn_code.co_name}")
        bound = bind_arguments(fn_code, args, kwargs, defaults, kwdefaults)
        cells = {}
        for cname, cell in zip(fn_code.co_freevars, closure_cells or ()):
            cells[cname] = cell
        frame = Frame(self.capture, fn_code, f_globals, bound, cells, parent=self)
        if frame.is_generator:
            gen = GeneratorVariable(frame)  # runs as it is consumed
            self.made_generators.append(gen)
            return gen
        return frame.run()

    # ---- helpers ------------------------------------------------------------------------------
    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        vals = self.stack[-n:]
        del self.stack[-n:]
        return vals

    def where(self, inst=None):
        inst = inst or self.current
        line = inst.positions.lineno if inst is not None and inst.positions else self.code.co_firstlineno
        return f"{self.code.co_filename}:{line}"

    def load_local(self, name):
        v = self.locals.get(name)
        if v is None:
            raise Unsupported(f"local variable {name!r} referenced before assignment")
        if isinstance(v, _LazyArg):
            v = self.og.wrap(v.value, LocalSource(v.index, v.name))
            self.locals[name] = v
        return v

    # ---- the loop -----------------------------------------------------------------------------
    def run(self):
        """Run to RETURN_VALUE and return the returned Variable; a generator frame also stops at each
        yield, returning a _Yielded."""
        capture = self.capture
        if self.thrown is not None:  # gen.throw()/close(): the exception comes out of the paused yield
            exc, self.thrown = self.thrown, None
            tracebacks.passes_through(self, exc, self.insts[self.ip - 1])  # (raised at the paused yield)
            if not self._handle_exception(self.insts[self.ip - 1], exc):
                raise Unsupported(f"{type(exc).__name__} thrown into a generator", python_exception=exc)
        while True:
            inst = self.insts[self.ip]
            self.current = inst
            self.og.frame = self  # (after an inlined call returns, its caller is the running frame again)
            if self.parent is None and inst.offset == capture.break_at:
                return capture.graph_break(self, inst)
            self.ip += 1
            capture.steps += 1
            if capture.steps > MAX_STEPS:
                raise Unsupported("capture took too many steps (an unbounded loop?)", kind="capture_limit")
            handler = getattr(self, inst.opname, None)
            try:
                if handler is None:
                    raise Unsupported(f"{NOT_CAPTURED.get(inst.opname, 'opcode ' + inst.opname)} is not supported "
                                      f"(opcode {inst.opname})", kind="unsupported_python")
                result = handler(inst)
            except Unsupported as e:
                if e.python_exception is not None:
                    if e.reraised_in is not self:  # (a bare raise or RERAISE adds no traceback entry)
                        tracebacks.passes_through(self, e.python_exception, inst)
                    if self._handle_exception(inst, e.python_exception):
                        continue
                # name the innermost line of the user's own code (not torch's or the stdlib's)
                if e.where is None or (not getattr(e, "where_is_user", False) and is_user_file(self.code.co_filename)):
                    e.where = self.where(inst)
                    e.where_is_user = is_user_file(self.code.co_filename)
                    line = linecache.getline(self.code.co_filename, inst.positions.lineno).strip() \
                        if inst.positions and inst.positions.lineno else ""
                    e.args = (f"{e.msg} (at {e.where}" + (f": {line})" if line else ")"),)
                if self.parent is None:
                    capture.request_break(self, inst, e)
                raise
            except RecursionError:
                raise Unsupported("recursion too deep during capture", kind="capture_limit")
            if self.og.watch.dims:  # attribute new shape guards to the user line that made them
                self.og.watch.after_step(self, inst)
            if result is not None:
                return result[0]

    def _handle_exception(self, inst, exc):
        """A real Python exception raised by code run natively during capture (e.g. a query that fails
        on this machine) inside a try block: continue at the handler, as CPython would."""
        for entry in self._exception_table():
            if entry.start <= inst.offset < entry.end:
                del self.stack[entry.depth:]
                if entry.lasti:
                    self.push(const(inst.offset))
                self.push(ObjectVariable(exc))
                self.ip = self.index_of[entry.target]
                return True
        return False

    def _exception_table(self):
        return _EXCEPTION_TABLES.setdefault(self.code, lambda: facts.exception_table(self.code))

    def PUSH_EXC_INFO(self, inst):
        exc = self.pop()
        self.push(self.exc_info or const(None))  # the exception handled before, restored by POP_EXCEPT
        self.exc_info = exc
        self.push(exc)

    def CHECK_EXC_MATCH(self, inst):
        cls = self.pop()
        exc = self.stack[-1]
        self.push(const(isinstance(exc.value, objects.const_value(cls))))

    def POP_EXCEPT(self, inst):
        prior = self.pop()
        self.exc_info = None if isinstance(prior, ConstantVariable) and prior.value is None else prior

    def RERAISE(self, inst):
        value = getattr(self.pop(), "value", None)
        if isinstance(value, BaseException):  # an exception raised during capture, continuing outwards
            raise _reraised(self, value)
        raise Unsupported("re-raising an exception during capture")

    def WITH_EXCEPT_START(self, inst):
        """An exception leaves a with-block: call its __exit__(type, value, traceback)."""
        exc = self.stack[-1]
        value = getattr(exc, "value", None)
        if not isinstance(value, BaseException):
            raise Unsupported("a with-block left by an exception capture does not know")
        exc_type = self.og.wrap(type(value), None, guard=False)  # (and its traceback, as CPython passes it)
        self.push(objects.call(self, self.stack[-4], [exc_type, exc, tracebacks.traceback_var(self.og, exc)], {}))

    # ---- stack ----------------------------------------------------------------------------------
    def NOP(self, inst):
        pass

    RESUME = PRECALL = NOP

    def POP_TOP(self, inst):
        self.pop()

    def PUSH_NULL(self, inst):
        self.push(NULL)

    def COPY(self, inst):
        self.push(self.stack[-inst.arg])

    def SWAP(self, inst):
        self.stack[-1], self.stack[-inst.arg] = self.stack[-inst.arg], self.stack[-1]

    def RETURN_GENERATOR(self, inst):
        self.push(const(None))

    def YIELD_VALUE(self, inst):
        if not self.is_generator:
            raise Unsupported("yield outside an inlined generator")
        value = self.pop()
        self.push(const(None))  # what the yield expression gives when next() resumes the frame
        return (_Yielded(value),)

    def resume_generator(self, sent=None, thrown=None):
        """Run this generator frame to its next yield: the yielded Variable, or None once it returns
        (its return value is then in self.returned). `sent` replaces the None the paused yield gives;
        `thrown` is raised at the paused yield instead."""
        if sent is not None:
            self.stack[-1] = sent
        self.thrown = thrown
        out = self.run()
        if isinstance(out, _Yielded):
            return out.value
        self.returned = out
        return None

    def yield_from_target(self):
        """The sub-iterator a paused `yield from` delegates to, or None (paused at a plain yield)."""
        if self.ip >= 2 and self.insts[self.ip - 1].opname == "YIELD_VALUE" and self.insts[self.ip - 2].opname == "SEND":
            return self.stack[-2]
        return None

    def finish_yield_from(self, value):
        """Leave the paused `yield from` with `value` as its result (its sub-generator has returned)."""
        if facts.SEND_KEEPS_RECEIVER:
            self.stack[-1] = value  # SEND jumps to END_SEND, which drops the receiver below it
        else:
            del self.stack[-2:]
            self.push(value)
        self.jump(self.insts[self.ip - 2])

    def CLEANUP_THROW(self, inst):
        """3.12+: an exception thrown into a paused `yield from` came back out of it. StopIteration
        ends the `yield from` with its value (in place of the receiver and the last value sent);
        anything else propagates."""
        exc = getattr(self.stack[-1], "value", None)
        if isinstance(exc, StopIteration):
            del self.stack[-3:]
            self.push(const(None))  # where the receiver was: END_SEND drops it
            value = exc.value  # a Variable, or a plain value (see generator_models.stop_iteration)
            self.push(value if isinstance(value, Variable) else objects.wrap_const(self.og, value))
            return
        if isinstance(exc, BaseException):  # (its entry for this frame was made where it was thrown in)
            raise _reraised(self, exc)
        raise Unsupported("an exception capture does not know, thrown through `yield from`")

    def GET_YIELD_FROM_ITER(self, inst):
        self.push(objects.get_iter(self, self.pop()))

    def SEND(self, inst):
        sent, it = self.pop(), self.stack[-1]
        if isinstance(it, GeneratorVariable):
            item = it.next(None if sent.is_constant() and sent.value is None else sent)
        elif not (sent.is_constant() and sent.value is None):
            raise Unsupported(f"send() into {type(it).__name__} through `yield from`")
        else:
            item = objects.iter_next(self, it) if isinstance(it, BaseIterator) else None
        if item is None:
            returned = it.return_value if isinstance(it, GeneratorVariable) else const(None)
            if facts.SEND_KEEPS_RECEIVER:
                self.push(returned)  # the sub-iterator's return value; END_SEND drops the receiver
            else:
                self.stack[-1] = returned
            self.jump(inst)
        else:
            self.push(item)

    def END_SEND(self, inst):
        del self.stack[-2]  # 3.12+: the receiver below the sub-iterator's return value

    def RETURN_VALUE(self, inst):
        value = self.pop()
        if self.made_generators:
            for hook in ON_RETURN:
                hook(self, value)
        return (value,)

    def RETURN_CONST(self, inst):
        return (objects.wrap_const(self.og, inst.argval),)

    # ---- names ----------------------------------------------------------------------------------
    def LOAD_CONST(self, inst):
        self.push(objects.wrap_const(self.og, inst.argval))

    def LOAD_FAST(self, inst):
        if facts.CELLS_LOADED_BY_LOAD_FAST and inst.argval in self.cells:
            self.push(self.cells[inst.argval])  # 3.13's LOAD_CLOSURE: the cell itself, for a closure
            return
        self.push(self.load_local(inst.argval))

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, inst):
        """3.12+ inlined comprehension: save what its variable's slot holds (a value, a cell when the
        frame's variable of that name is a cell, or nothing) on the stack, and empty the slot."""
        name = inst.argval
        saved = self.cells.pop(name) if name in self.cells else self.locals.pop(name, _UNBOUND)
        self.locals.pop(name, None)
        self.push(saved)

    def STORE_FAST(self, inst):
        self.store_local(inst.argval, self.pop())

    def store_local(self, name, value):
        """Put `value` in the slot of `name`, as CPython does: it replaces a cell there too (an inlined
        comprehension's plain variable shares the slot of a cell of the same name), and a cell or
        nothing is put back after an inlined comprehension (what LOAD_FAST_AND_CLEAR saved)."""
        self.cells.pop(name, None)
        self.locals.pop(name, None)
        if isinstance(value, (CellVariable, RealCell)):
            self.cells[name] = value
        elif value is not _UNBOUND:
            self.locals[name] = value

    def LOAD_FAST_LOAD_FAST(self, inst):
        for name in inst.argval:
            self.push(self.load_local(name))

    def STORE_FAST_LOAD_FAST(self, inst):
        stored, loaded = inst.argval
        self.store_local(stored, self.pop())
        self.push(self.load_local(loaded))

    def STORE_FAST_STORE_FAST(self, inst):
        for name in inst.argval:
            self.store_local(name, self.pop())

    def DELETE_FAST(self, inst):
        self.locals.pop(inst.argval, None)

    def LOAD_GLOBAL(self, inst):
        value = self.load_global(inst.argval)
        self.stack.extend(facts.with_null(value, NULL) if inst.arg & 1 else [value])

    def load_global(self, name):
        source = GlobalSource(self.f_globals, name, self.root_globals)
        stored = self.og.side_effects.load_global(source)
        if stored is not None:
            return stored
        if name in self.f_globals:
            return self.og.wrap(self.f_globals[name], source)
        builtins = self.f_globals.get("__builtins__", __builtins__)
        builtins = builtins if isinstance(builtins, dict) else builtins.__dict__
        if name in builtins:
            return self.og.wrap(builtins[name], None, guard=False)
        raise Unsupported(f"name {name!r} is not defined")

    def STORE_GLOBAL(self, inst):
        source = GlobalSource(self.f_globals, inst.argval, self.root_globals)
        self.og.side_effects.store_global(source, self.pop())

    def MAKE_CELL(self, inst):
        name = inst.argval
        if name in self.cells:
            return
        initial = self.locals.pop(name, None)
        cell = CellVariable()
        if initial is not None:
            cell.contents = self.load_local_value(initial)
        self.cells[name] = cell

    def load_local_value(self, v):
        if isinstance(v, _LazyArg):
            return self.og.wrap(v.value, LocalSource(v.index, v.name))
        return v

    def COPY_FREE_VARS(self, inst):
        pass  # cells of free variables were set up when the frame was made

    def LOAD_CLOSURE(self, inst):
        self.push(self.cells[inst.argval])

    def LOAD_DEREF(self, inst):
        self.push(self.load_cell(self.cells[inst.argval], inst.argval))

    def load_cell(self, cell, name):
        if isinstance(cell, CellVariable):
            if cell.contents is CellVariable._EMPTY:
                raise Unsupported(f"free variable {name!r} referenced before assignment")
            return cell.contents
        stored = self.og.side_effects.load_cell(cell.cell)
        if stored is not None:
            return stored
        try:
            value = cell.cell.cell_contents
        except ValueError:
            raise Unsupported(f"free variable {name!r} referenced before assignment") from None
        return self.og.wrap(value, cell.source)

    def STORE_DEREF(self, inst):
        cell, value = self.cells[inst.argval], self.pop()
        if isinstance(cell, CellVariable):
            if cell.frozen:
                raise Unsupported(f"{inst.argval!r} changes after a class made in the frame closed over it")
            cell.contents = value
        else:
            self.og.side_effects.store_cell(cell.cell, cell.source, value)

    LOAD_CLASSDEREF = LOAD_DEREF

    # ---- attributes and items -------------------------------------------------------------------
    def LOAD_ATTR(self, inst):
        obj = self.pop()
        value = objects.getattr_var(self, obj, inst.argval)
        self.stack.extend(facts.with_null(value, NULL) if facts.loads_method(inst) else [value])

    LOAD_METHOD = LOAD_ATTR

    def LOAD_SUPER_ATTR(self, inst):
        """3.12+ `super().name` / `super(C, self).name`: the stack holds super, the class and self."""
        global_super, cls, obj = self.popn(3)
        value = objects.getattr_var(self, objects.call(self, global_super, [cls, obj], {}), inst.argval)
        self.stack.extend(facts.with_null(value, NULL) if facts.loads_method(inst) else [value])

    def STORE_ATTR(self, inst):
        obj, value = self.pop(), self.pop()
        objects.setattr_var(self, obj, inst.argval, value)

    def DELETE_ATTR(self, inst):
        objects.delattr_var(self, self.pop(), inst.argval)

    def BINARY_SUBSCR(self, inst):
        key = self.pop()
        obj = self.pop()
        self.push(objects.getitem(self, obj, key))

    def STORE_SUBSCR(self, inst):
        key, obj, value = self.pop(), self.pop(), self.pop()
        objects.setitem(self, obj, key, value)

    def DELETE_SUBSCR(self, inst):
        key, obj = self.pop(), self.pop()
        objects.delitem(self, obj, key)

    def BUILD_SLICE(self, inst):
        self.push(self.make_slice(self.popn(inst.arg)))

    def make_slice(self, parts):
        if all(p.is_constant() for p in parts):
            return const(slice(*(p.value for p in parts)))
        if all(p.is_constant() or isinstance(p, SymNodeVariable) for p in parts):
            return SliceVariable(parts)  # indexes a tensor symbolically; specialized elsewhere
        raise Unsupported("slice with non-constant bounds")

    def BINARY_SLICE(self, inst):
        obj, start, stop = self.popn(3)
        self.push(objects.getitem(self, obj, self.make_slice([start, stop])))

    def STORE_SLICE(self, inst):
        value, obj, start, stop = self.popn(4)
        objects.setitem(self, obj, self.make_slice([start, stop]), value)

    # ---- operators ------------------------------------------------------------------------------
    def BINARY_OP(self, inst):
        b, a = self.pop(), self.pop()
        self.push(objects.apply_operator(self, BINARY_OPS[inst.arg], [a, b]))

    def COMPARE_OP(self, inst):
        b, a = self.pop(), self.pop()
        self.push(objects.apply_operator(self, COMPARE_OPS[inst.argval], [a, b]))

    def _unary(self, inst):
        self.push(objects.apply_operator(self, UNARY_OPS[inst.opname], [self.pop()]))

    UNARY_NEGATIVE = UNARY_POSITIVE = UNARY_INVERT = UNARY_NOT = _unary

    def TO_BOOL(self, inst):
        """3.13 puts TO_BOOL before each jump on truth and each `not`; those consumers take the truth of
        the value themselves (once, as CPython does here), so the value stays as it is. A graph break
        on a tensor's truth then happens at the jump, where the glue can resume."""

    def CALL_INTRINSIC_1(self, inst):
        kind, value = inst.argrepr, self.pop()
        if kind == "INTRINSIC_LIST_TO_TUPLE":
            self.push(objects.make_tuple(value.items))
        elif kind == "INTRINSIC_UNARY_POSITIVE":
            self.push(objects.apply_operator(self, operator.pos, [value]))
        elif kind == "INTRINSIC_STOPITERATION_ERROR":  # a generator's body raised: StopIteration becomes RuntimeError
            exc = getattr(value, "value", None)
            if isinstance(exc, StopIteration):
                exc = stop_iteration_error(exc)
            self.push(ObjectVariable(exc) if isinstance(exc, BaseException) else value)
        else:
            raise Unsupported(f"{kind} is not supported (CALL_INTRINSIC_1)")

    def CALL_INTRINSIC_2(self, inst):
        what = "except* (exception groups)" if inst.argrepr == "INTRINSIC_PREP_RERAISE_STAR" else inst.argrepr
        raise Unsupported(f"{what} is not supported (CALL_INTRINSIC_2)")

    def IS_OP(self, inst):
        b, a = self.pop(), self.pop()
        if isinstance(a, TensorVariable) and isinstance(b, TensorVariable) and a.fake is not b.fake and \
                a.source is not None and b.source is not None:
            self.og.guards.distinct(a.source, b.source)  # two inputs found not to be one object
        same = objects.is_same(a, b)
        self.push(const(same != bool(inst.arg)))

    def CONTAINS_OP(self, inst):
        container, item = self.pop(), self.pop()
        found = objects.contains(self, container, item)
        self.push(const(found != bool(inst.arg)))

    # ---- containers -----------------------------------------------------------------------------
    def BUILD_TUPLE(self, inst):
        self.push(objects.make_tuple(self.popn(inst.arg)))

    def BUILD_LIST(self, inst):
        self.push(ListVariable(self.popn(inst.arg)))

    def BUILD_SET(self, inst):
        self.push(objects.new_set(self.popn(inst.arg)))

    def BUILD_MAP(self, inst):
        items = self.popn(2 * inst.arg)
        self.push(DictVariable({objects.dict_key(k): v for k, v in zip(items[::2], items[1::2])}))

    def BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop()
        values = self.popn(inst.arg)
        self.push(DictVariable(dict(zip(objects.const_value(keys), values))))

    def BUILD_STRING(self, inst):
        parts = self.popn(inst.arg)
        self.push(const("".join(objects.const_value(p) for p in parts)))

    def FORMAT_VALUE(self, inst):
        spec = self.pop().value if (inst.arg & 0x04) else ""
        self.push(const(objects.formatted(self, self.pop(), _CONVERSIONS[inst.arg & 0x03], spec)))

    def CONVERT_VALUE(self, inst):  # 3.13: the !s / !r / !a of an f-string field
        self.push(const(objects.formatted(self, self.pop(), _CONVERSIONS[inst.arg])))

    def FORMAT_SIMPLE(self, inst):  # 3.13: an f-string field without a format spec
        self.push(const(objects.formatted(self, self.pop())))

    def FORMAT_WITH_SPEC(self, inst):  # 3.13: an f-string field with a format spec
        spec = objects.const_value(self.pop(), "a non-constant format spec")
        self.push(const(objects.formatted(self, self.pop(), spec=spec)))

    def LIST_APPEND(self, inst):
        v = self.pop()
        self.stack[-inst.arg].items.append(v)

    def SET_ADD(self, inst):
        v = self.pop()
        target = self.stack[-inst.arg]
        objects.set_add(target, [v])

    def MAP_ADD(self, inst):
        v, k = self.pop(), self.pop()
        self.stack[-inst.arg].items[objects.dict_key(k)] = v

    def LIST_EXTEND(self, inst):
        v = self.pop()
        self.stack[-inst.arg].items.extend(objects.unpack_iterable(self, v))

    def SET_UPDATE(self, inst):
        v = self.pop()
        target = self.stack[-inst.arg]
        objects.set_update(self, target, v)

    def DICT_UPDATE(self, inst):
        v = self.pop()
        self.stack[-inst.arg].items.update(objects.dict_items(self, v))

    DICT_MERGE = DICT_UPDATE

    def LIST_TO_TUPLE(self, inst):
        self.push(objects.make_tuple(self.pop().items))

    def UNPACK_SEQUENCE(self, inst):
        items = objects.unpack_iterable(self, self.pop())
        if len(items) != inst.arg:
            raise Unsupported(f"unpacking {len(items)} values into {inst.arg}")
        self.stack.extend(reversed(items))

    def UNPACK_EX(self, inst):
        items = objects.unpack_iterable(self, self.pop())
        before, after = inst.arg & 0xFF, inst.arg >> 8
        if len(items) < before + after:
            raise Unsupported("not enough values to unpack")
        middle = ListVariable(items[before:len(items) - after])
        vals = items[:before] + [middle] + items[len(items) - after:]
        self.stack.extend(reversed(vals))

    # ---- calls ----------------------------------------------------------------------------------
    def KW_NAMES(self, inst):
        self.kw_names = self.code.co_consts[inst.arg]

    def CALL(self, inst):
        kw_names, self.kw_names = self.kw_names or (), None
        self._call(inst.arg, kw_names)

    def CALL_KW(self, inst):  # 3.13: the keyword names are a tuple on top of the stack
        kw_names = objects.const_value(self.pop())
        self._call(inst.arg, kw_names)

    def _call(self, n, kw_names):
        fn, args, kwargs = call_parts(self.popn(n + 2), kw_names)
        self.push(objects.call(self, fn, args, kwargs))

    def CALL_FUNCTION_EX(self, inst):
        kwargs = self.pop() if inst.arg & 1 else None
        args = self.pop()
        fn, bound_self = facts.callable_and_self(*self.popn(2), is_null=is_null)
        pos = ([bound_self] if bound_self is not None else []) + objects.unpack_iterable(self, args)
        kw = objects.dict_items(self, kwargs) if kwargs is not None else {}
        self.push(objects.call(self, fn, pos, kw))

    def MAKE_FUNCTION(self, inst):
        code = self.pop().value
        flags = inst.arg or 0  # 3.13: no flags; SET_FUNCTION_ATTRIBUTE sets each attribute instead
        closure = self.pop().items if flags & 0x08 else None
        annotations = objects.annotations_dict(self.pop()) if flags & 0x04 else None
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        self.push(FunctionVariable(code, self.f_globals, code.co_qualname, defaults, kwdefaults, closure,
                                   annotations))

    def SET_FUNCTION_ATTRIBUTE(self, inst):
        fn, value = self.pop(), self.pop()
        if inst.arg == 0x08:
            fn.closure = value.items
        elif inst.arg == 0x02:
            fn.kwdefaults = value
        elif inst.arg == 0x01:
            fn.defaults = value
        elif inst.arg == 0x04:  # a flat tuple name, value, ... (as MAKE_FUNCTION's)
            fn.slots["__annotations__"] = objects.annotations_dict(value)
        self.push(fn)

    # ---- control flow ---------------------------------------------------------------------------
    def jump(self, inst):
        self.ip = self.index_of[inst.argval]

    JUMP_FORWARD = JUMP_BACKWARD = JUMP_BACKWARD_NO_INTERRUPT = jump

    def _pop_jump(self, inst, when):
        value = self.pop()
        if data_scalars.is_data_dependent(value) and self._assert_on_data(inst, value, when):
            return
        if objects.truth(self, value) == when:
            self.jump(inst)

    def _assert_on_data(self, inst, value, when):
        """`assert cond` on a number only the graph knows: one side of the jump is the assert's
        failure path. The graph checks cond when it runs and capture takes the other side."""
        if data_scalars.is_assert_branch(self.insts, self.ip):  # falls through into the raise
            data_scalars.assert_in_graph(self, value, when, self.where(inst))
            self.jump(inst)
            return True
        if data_scalars.is_assert_branch(self.insts, self.index_of[inst.argval]):  # jumps into it
            data_scalars.assert_in_graph(self, value, not when, self.where(inst))
            return True
        return False

    def POP_JUMP_FORWARD_IF_TRUE(self, inst):
        self._pop_jump(inst, True)

    def POP_JUMP_FORWARD_IF_FALSE(self, inst):
        self._pop_jump(inst, False)

    POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE = POP_JUMP_FORWARD_IF_TRUE
    POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE = POP_JUMP_FORWARD_IF_FALSE

    def _jump_none(self, inst, when):
        value = self.pop()
        if objects.is_same(value, const(None)) == when:
            self.jump(inst)

    def POP_JUMP_FORWARD_IF_NONE(self, inst):
        self._jump_none(inst, True)

    def POP_JUMP_FORWARD_IF_NOT_NONE(self, inst):
        self._jump_none(inst, False)

    POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE = POP_JUMP_FORWARD_IF_NONE
    POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE = POP_JUMP_FORWARD_IF_NOT_NONE

    def JUMP_IF_TRUE_OR_POP(self, inst):
        if objects.truth(self, self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def JUMP_IF_FALSE_OR_POP(self, inst):
        if not objects.truth(self, self.stack[-1]):
            self.jump(inst)
        else:
            self.pop()

    def GET_ITER(self, inst):
        self.push(objects.get_iter(self, self.pop()))

    def FOR_ITER(self, inst):
        it = self.stack[-1]
        if not isinstance(it, BaseIterator):
            raise Unsupported(f"iterating over {it!r}")
        item = objects.iter_next(self, it)
        if item is None:
            self.pop()
            self.jump(inst)
            self.ip += facts.FOR_ITER_EXIT_SKIPS  # 3.12+: past END_FOR (and 3.13's POP_TOP)
        else:
            self.push(item)

    def END_FOR(self, inst):
        self.popn(facts.END_FOR_POPS)

    def GET_LEN(self, inst):
        self.push(const(len(objects.unpack_iterable(self, self.stack[-1]))))

    # ---- with blocks (grad mode, autocast, user context managers) -----------------------------------------------------------
    def BEFORE_WITH(self, inst):
        ctx = self.pop()
        if isinstance(ctx, GradModeVariable):
            prior = self.og.grad_enabled if ctx.prior is None else ctx.prior
            ctx.entered_from = self.og.grad_enabled
            if ctx.value is not None and ctx.cls in (torch.no_grad, torch.enable_grad):  # its __enter__ sets prev
                self.og.side_effects.store_attr(ctx, "prev", const(self.og.grad_enabled))
            self.og.set_grad_enabled(ctx.enabled)
            self.push(ExitVariable(lambda: self.og.set_grad_enabled(prior), restores=prior))
            self.push(const(None))
            return
        if isinstance(ctx, NativeBlockVariable):  # entered by the glue before the graph call
            self.og.native_enters.append(ctx)
            exit_var = ExitVariable(None, native=ctx)
            exit_var.on_exit = lambda: self.og.native_exits.append(exit_var)
            self.push(exit_var)
            self.push(ctx)  # (what their __enter__ returns)
            return
        if isinstance(ctx, AutocastVariable):
            self.push(ExitVariable(self.og.enter_autocast(ctx.mode_args)))
            self.push(const(None))
            return
        if isinstance(ctx, (FreshObjectVariable, ObjectVariable)) and \
                objects.python_dunder(ctx.python_type(), "__enter__") and \
                objects.python_dunder(ctx.python_type(), "__exit__"):
            exit_fn = objects.special_method(self, ctx, "__exit__")
            entered = objects.call(self, objects.special_method(self, ctx, "__enter__"), [], {})
            self.push(exit_fn)
            self.push(entered)
            return
        raise Unsupported(f"with-block over {objects.describe(ctx)} is not supported")

    # ---- match statements -----------------------------------------------------------------------
    def MATCH_MAPPING(self, inst):
        import collections.abc
        self.push(const(issubclass(self.stack[-1].python_type(), collections.abc.Mapping)))

    def MATCH_SEQUENCE(self, inst):
        import collections.abc
        t = self.stack[-1].python_type()
        self.push(const(issubclass(t, collections.abc.Sequence) and not issubclass(t, (str, bytes, bytearray))))

    def MATCH_KEYS(self, inst):
        keys = objects.const_value(self.stack[-1], "match keys")
        subject = self.stack[-2]
        items = objects.dict_items(self, subject)
        if all(k in items for k in keys):
            self.push(objects.make_tuple([items[k] for k in keys]))
        else:
            self.push(const(None))

    # ---- imports, asserts, raise ----------------------------------------------------------------
    def IMPORT_NAME(self, inst):
        fromlist, level = self.pop(), self.pop()
        module = __import__(inst.argval, self.f_globals, None, objects.const_value(fromlist),
                            objects.const_value(level))
        self.push(ObjectVariable(module))

    def IMPORT_FROM(self, inst):
        self.push(objects.getattr_var(self, self.stack[-1], inst.argval))

    def LOAD_BUILD_CLASS(self, inst):
        self.push(ObjectVariable(builtins.__build_class__))

    def LOAD_ASSERTION_ERROR(self, inst):
        self.push(ObjectVariable(AssertionError))

    def handled_exception(self):
        """The Variable of the exception being handled here as CPython sees it: this frame's, else
        that of the nearest calling frame of the capture handling one. Past the compiled function's
        own frame its caller may handle one: capture answers none and guards so (and refuses when the
        caller handles one now, as it does then)."""
        f = self
        while f is not None:
            if isinstance(getattr(f.exc_info, "value", None), BaseException):
                return f.exc_info
            f = f.parent
        if self.og.caller_exception is not None:
            raise Unsupported("the exception the compiled function's caller is handling", kind="unsupported_python")
        guards = self.og.guards
        guards.add(None, f"{guards.const(sys.exc_info, 'EXCINFO')}()[0] is None",
                   "the compiled function's caller is handling no exception")
        return None

    def RAISE_VARARGS(self, inst):
        if inst.arg == 0:  # bare `raise`: the exception being handled, here or in a calling frame
            handled = getattr(self.handled_exception(), "value", None)
            if handled is None:
                e = RuntimeError("No active exception to reraise")
                raise Unsupported(str(e), python_exception=e)
            raise _reraised(self, handled)
        cause = self.pop() if inst.arg == 2 else None
        value = _exception_instance(self.pop())
        if inst.arg == 2:
            cause_value = None if isinstance(cause, ConstantVariable) and cause.value is None else \
                _exception_instance(cause)
            if cause_value is None and not (isinstance(cause, ConstantVariable) and cause.value is None):
                raise Unsupported("raise ... from something that is not an exception capture knows")
            if value is not None:
                value.__cause__ = cause_value  # also sets __suppress_context__, as `raise from` does
        if value is None:
            raise Unsupported("raise statement reached during capture")
        handled = getattr(self.handled_exception(), "value", None)  # (a callee raising sees its caller's)
        if isinstance(handled, BaseException) and handled is not value:
            _chain_context(value, handled)
        raise Unsupported(f"{type(value).__name__} raised: {value}", python_exception=value)


def _reraised(frame, value):
    """`value` raised again as it is, by a bare raise or RERAISE in `frame`: its traceback gains no
    entry there (CPython's RERAISE unwinds without PyTraceBack_Here)."""
    e = Unsupported(f"{type(value).__name__} re-raised: {value}", python_exception=value)
    e.reraised_in = frame
    return e


def _chain_context(value, handled):
    """value.__context__ = handled, as CPython sets it on raise. CPython first cuts `value` out of the
    chain below `handled` (so it never loops); that changes an exception capture may not own: refused."""
    link, seen = handled, set()
    while link.__context__ is not None and id(link) not in seen:
        seen.add(id(link))
        if link.__context__ is value:
            raise Unsupported("a raise that cuts a loop out of an exception's __context__ chain",
                              kind="unsupported_python")
        link = link.__context__
    value.__context__ = handled


def _exception_instance(v):
    """The real exception a raise statement raises: an instance, or a class instantiated; else None."""
    value = getattr(v, "value", None)
    if isinstance(value, type) and issubclass(value, BaseException):
        value = value()
    return value if isinstance(value, BaseException) else None


_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


class _Unbound:
    """What LOAD_FAST_AND_CLEAR saves for a variable that had no value (STORE_FAST of it unbinds)."""

    def __repr__(self):
        return "<unbound>"


_UNBOUND = _Unbound()


def is_null(v):
    return isinstance(v, NullVariable)


def call_parts(slots, kw_names):
    """A call's stack slots (the two below the arguments, then the arguments; keyword values last,
    named by `kw_names`) -> (callable, positional args, kwargs)."""
    fn, bound_self = facts.callable_and_self(slots[0], slots[1], is_null=is_null)
    args = ([bound_self] if bound_self is not None else []) + list(slots[2:])
    nkw = len(kw_names)
    kwargs = dict(zip(kw_names, args[len(args) - nkw:])) if nkw else {}
    return fn, args[:len(args) - nkw], kwargs


def bind_arguments(code, args, kwargs, defaults, kwdefaults):
    """Bind call arguments (Variables) to a code object's parameters, as CPython does; -> {name: Variable}."""
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    posonly = code.co_posonlyargcount
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound = {}
    for name, v in zip(names[:nargs], args):
        bound[name] = v
    extra = args[nargs:]
    if extra and not has_varargs:
        raise Unsupported(f"{code.co_name}() got too many positional arguments")
    varkw = {}
    for k, v in kwargs.items():
        if k in names[posonly:nargs + nkw]:
            if k in bound:
                raise Unsupported(f"{code.co_name}() got multiple values for {k!r}")
            bound[k] = v
        elif has_varkw:
            varkw[k] = v
        else:
            raise Unsupported(f"{code.co_name}() got an unexpected keyword argument {k!r}")
    defaults = defaults or []
    first_default = nargs - len(defaults)
    for i, name in enumerate(names[:nargs]):
        if name not in bound:
            if i >= first_default:
                bound[name] = defaults[i - first_default]
            else:
                raise Unsupported(f"{code.co_name}() missing argument {name!r}")
    for name in names[nargs:nargs + nkw]:
        if name not in bound:
            if kwdefaults and name in kwdefaults:
                bound[name] = kwdefaults[name]
            else:
                raise Unsupported(f"{code.co_name}() missing keyword argument {name!r}")
    i = nargs + nkw
    if has_varargs:
        bound[names[i]] = TupleVariable(extra)
        i += 1
    if has_varkw:
        bound[names[i]] = DictVariable(varkw)
    return bound


def root_frame(capture, F, L, code):
    """The captured frame itself: arguments come from L, wrapped lazily on first read."""
    nparams = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + \
        bool(code.co_flags & inspect.CO_VARKEYWORDS)
    local_values = {name: _LazyArg(i, name, L[i]) for i, name in enumerate(code.co_varnames[:nparams])}
    cells = {}
    closure = F.__closure__ or ()
    for i, (name, cell) in enumerate(zip(code.co_freevars, closure)):
        cells[name] = RealCell(cell, CellSource(name, index=i))
    return Frame(capture, code, F.__globals__, local_values, cells, root_globals=True)

