"""The generator protocol over generators made during capture, as CPython runs it: send(), throw(),
close() (delegated through `yield from` to the sub-generator first), __next__, and `in` (which
consumes the generator up to the first match), and the close CPython does when a frame drops a
suspended generator. Registered in objects.VARIABLE_MODELS and interpreter.ON_RETURN."""
import sys
import types

from kiln.capture import interpreter as interp
from kiln.capture import objects
from kiln.capture.objects import TypeModel, const_value
from kiln.capture.variables import (ConstantVariable, GeneratorVariable, MethodVariable, ObjectVariable, TensorVariable,
                                    TupleVariable, Variable, const)
from kiln.exc import Unsupported

_METHODS = ("send", "throw", "close", "__next__", "__iter__")


def stop_iteration(gen, was_done):
    """The StopIteration a generator raises on next()/send(): carrying its return value when this
    call finished it (a Variable; reading `.value` gives it back), empty when it had finished before."""
    value = None if was_done else gen.return_value
    if value is None or isinstance(value, ConstantVariable) and value.value is None:
        exc = StopIteration()
    else:
        exc = StopIteration(value.value if isinstance(value, ConstantVariable) else value)
    return Unsupported("StopIteration", python_exception=exc)


def _raised(exc):
    return Unsupported(f"{type(exc).__name__} raised: {exc}", python_exception=exc)


def _exception(frame, args):
    """throw()'s argument(s) as a real exception instance: a class (instantiated), or an instance."""
    first = args[0].value if isinstance(args[0], (ObjectVariable, ConstantVariable)) else None
    if isinstance(first, type) and issubclass(first, BaseException):
        value = const_value(args[1], "throw value") if len(args) > 1 else None
        return first() if value is None else value if isinstance(value, first) else first(value)
    if isinstance(first, BaseException):
        return first
    raise Unsupported("throw() of something that is not an exception capture knows",
                      python_exception=TypeError("exceptions must be classes or instances deriving from BaseException"))


def send(gen, value):
    if gen.count == 0 and not (isinstance(value, ConstantVariable) and value.value is None):
        raise _raised(TypeError("can't send non-None value to a just-started generator"))
    was_done = gen.done
    item = gen.next(None if isinstance(value, ConstantVariable) and value.value is None else value)
    if item is None:
        raise stop_iteration(gen, was_done)
    return item


def throw(gen, exc):
    item = _throw(gen, exc)
    if item is None:
        raise stop_iteration(gen, False)
    return item


def _throw(gen, exc):
    """Raise `exc` at the paused yield (in the sub-generator first, through `yield from`): the next
    yielded Variable, or None when the generator returns; an exception it lets out propagates."""
    if gen.done or gen.count == 0:  # never started, or finished: raised here, and the generator is over
        gen.done = True
        raise _raised(exc)
    sub = gen.frame.yield_from_target()
    if isinstance(exc, GeneratorExit) and sub is not None:
        exc = _close_quietly(sub, exc)
    elif isinstance(sub, GeneratorVariable):
        try:
            item = _throw(sub, exc)
        except Unsupported as e:
            if e.python_exception is None:
                raise
            exc = e.python_exception  # the sub-generator's exception comes out of the `yield from`
        else:
            if item is not None:
                return item
            gen.frame.finish_yield_from(sub.return_value)  # it returned: the `yield from` is over
            return gen.next()
    return gen.next(thrown=exc)


def _next_or_stop(gen):
    was_done = gen.done
    item = gen.next()
    if item is None:
        raise stop_iteration(gen, was_done)
    return item


def _close_quietly(sub, exc):
    """Close a `yield from` target before GeneratorExit reaches its delegating generator: the
    exception to raise there (GeneratorExit, or what closing the sub-generator raised)."""
    if not isinstance(sub, GeneratorVariable):
        return exc
    try:
        close(sub)
    except Unsupported as e:
        if e.python_exception is None:
            raise
        return e.python_exception
    return exc


def close(gen):
    """GeneratorExit at the paused yield; finally blocks run. Returns the generator's return value
    on Python 3.13+ (None before), as CPython's close() does."""
    if gen.done or gen.count == 0:
        gen.done = True
        return const(None)
    try:
        item = _throw(gen, GeneratorExit())
    except Unsupported as e:
        if isinstance(e.python_exception, (GeneratorExit, StopIteration)):
            return const(None)
        raise
    if item is not None:
        raise _raised(RuntimeError("generator ignored GeneratorExit"))
    return gen.return_value if sys.version_info >= (3, 13) else const(None)


class GeneratorModel(TypeModel):
    protocols = True  # `in` comes here (iteration, next() and truth stay with the interpreter)

    def attribute(self, frame, gen, name):
        if name in _METHODS:
            return MethodVariable(name, gen)
        if name == "__class__":
            return frame.og.wrap(types.GeneratorType, None, guard=False)
        if name in ("__name__", "__qualname__"):
            return const(getattr(gen.frame.code, "co_qualname" if name == "__qualname__" else "co_name",
                                 gen.frame.code.co_name))
        if name == "gi_code":
            return frame.og.wrap(gen.frame.code, None, guard=False)
        if not hasattr(types.GeneratorType, name):
            raise Unsupported(f"AttributeError: generator has no attribute {name!r}",
                              python_exception=AttributeError(name))
        raise Unsupported(f"attribute {name!r} of a generator")

    def call_method(self, frame, gen, name, args, kwargs):
        if name == "send":
            return send(gen, args[0])
        if name == "throw":
            return throw(gen, _exception(frame, args))
        if name == "close":
            return close(gen)
        if name == "__next__":
            return _next_or_stop(gen)
        if name == "__iter__":
            return gen
        if name == "__contains__":
            while (item := gen.next()) is not None:
                if objects.contains(frame, TupleVariable([item]), args[0]):
                    return const(True)
            return const(False)
        raise Unsupported(f"TypeError: generator has no {name}", python_exception=TypeError(f"generator {name}"))


objects.VARIABLE_MODELS[GeneratorVariable] = GeneratorModel()


# ---- generators a returning frame drops ------------------------------------------------------------
def close_dropped(frame, returned):
    """CPython closes a suspended generator when its last reference goes, which for one a frame made
    and kept only in its locals is when the frame returns: its finally / `except GeneratorExit` blocks
    run then. Close (in the order made) the started, unfinished generators this frame made that nothing
    still live reaches: the return value, the frames below it, and the side effects. Within a generator
    frame the live frames are not known, so nothing is closed there."""
    chain = []
    f = frame.parent
    while f is not None:
        if f.is_generator:
            return
        chain.append(f)
        f = f.parent
    if frame.is_generator:
        return
    candidates = [g for g in frame.made_generators if g.count and not g.done]
    if not candidates:
        return
    se = frame.og.side_effects
    roots = [returned, [entry[1:] for entry in se.attr_stores.values()], list(se.global_stores.values()),
             list(se.cell_stores.values()), se.mutated]
    for f in chain:
        roots += [f.locals, f.stack, f.cells]
    live = _reachable_generators(roots)
    for gen in candidates:
        if id(gen) not in live:
            try:
                close(gen)
            except Unsupported as e:  # CPython reports it ("Exception ignored in") and goes on
                if e.python_exception is None:
                    raise


def _reachable_generators(roots):
    """ids of the GeneratorVariables reachable from `roots` (Variables, frames' locals/stacks, and the
    lists/tuples/dicts holding them). Existing objects, constants and tensors hold none."""
    seen, found, todo = set(), set(), list(roots)
    while todo:
        v = todo.pop()
        if id(v) in seen or isinstance(v, (ObjectVariable, ConstantVariable, TensorVariable)):
            continue
        seen.add(id(v))
        if isinstance(v, (list, tuple, set, frozenset)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, GeneratorVariable):
            found.add(id(v))
            todo += [v.frame.locals, v.frame.stack, v.frame.cells, v.return_value]
        elif isinstance(v, Variable) and hasattr(v, "__dict__"):
            todo.extend(vars(v).values())
    return found


interp.ON_RETURN.append(close_dropped)
