"""itertools iterators made in the frame, as lazy as CPython's: count, repeat, compress, filterfalse,
takewhile, dropwhile, starmap and islice each step only when an item is consumed (so they may be
infinite, and a predicate or function runs when CPython would run it), and one still open when the
frame returns or breaks is rebuilt as the same itertools object in the same state. tee's iterators
share one buffer of the items read from the source, as CPython's do.

Registered in objects.CONSTRUCTORS / ITERATOR_STEPS, python_builtins.BUILTIN_HANDLERS (tee) and
glue.REBUILDERS."""
import copy
import itertools
import operator

from kiln.capture import glue, objects
from kiln.capture.objects import (BUILTIN_HANDLERS, apply_operator, call, const_value, get_iter, iter_next, truth,
                                 unpack_iterable)
from kiln.capture.variables import BaseIterator, ConstantVariable, TupleVariable, Variable, const
from kiln.exc import Unsupported


class ItertoolsIterator(BaseIterator):
    """`kind(...)` made in the frame. `parts` holds what it reads from (Variables: an iterator, a
    function, the next count); `state` the plain numbers of its progress."""

    def __init__(self, kind, parts, **state):
        self.kind, self.parts, self.state = kind, parts, state

    def python_type(self):
        return self.kind


def _native_check(kind, args, kwargs):
    """Argument errors as CPython raises them: the real constructor judges the constant arguments
    (given empty iterables in place of the others)."""
    try:
        kind(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"itertools.{kind.__name__}: {e}", python_exception=e) from e


def _make(kind, frame, args, kwargs):
    # a stand-in for each argument when checking them natively: constants as they are, others as an
    # iterable ([]), or a number for count (whose arguments are numbers: a tensor, a symbolic size)
    other = 0 if kind is itertools.count else []

    def placeholder(v):
        return v.value if isinstance(v, ConstantVariable) else other
    _native_check(kind, [placeholder(a) for a in args], {k: placeholder(v) for k, v in kwargs.items()})
    return _MAKERS[kind](frame, *args, **kwargs)


def _never(item):
    return False


def _count(frame, start=const(0), step=const(1)):
    return ItertoolsIterator(itertools.count, {"next": start, "step": step})


def _repeat(frame, object, times=None):  # noqa: A002 (CPython's keyword name)
    left = None if times is None else max(0, const_value(times, "repeat's times"))
    return ItertoolsIterator(itertools.repeat, {"obj": object}, left=left)


def _compress(frame, data, selectors):
    return ItertoolsIterator(itertools.compress, {"data": get_iter(frame, data), "selectors": get_iter(frame, selectors)})


def _with_predicate(kind):
    def make(frame, fn, iterable):
        return ItertoolsIterator(kind, {"fn": fn, "it": get_iter(frame, iterable)}, active=True)
    return make


def _islice(frame, iterable, *bounds):
    values = [const_value(b, "islice's bounds") for b in bounds]
    start, stop, step = slice(*values).start or 0, slice(*values).stop, slice(*values).step or 1
    left = None if stop is None else max(0, (stop - start + step - 1) // step)
    return ItertoolsIterator(itertools.islice, {"it": get_iter(frame, iterable)}, skip=start, left=left, step=step)


_MAKERS = {itertools.count: _count, itertools.repeat: _repeat, itertools.compress: _compress,
           itertools.filterfalse: _with_predicate(itertools.filterfalse),
           itertools.takewhile: _with_predicate(itertools.takewhile),
           itertools.dropwhile: _with_predicate(itertools.dropwhile),
           itertools.starmap: _with_predicate(itertools.starmap), itertools.islice: _islice}


# ---- stepping: the next item's Variable, or None once exhausted ---------------------------------
def _next(frame, it):
    return _STEPS[it.kind](frame, it, it.parts, it.state)


def _count_next(frame, it, parts, state):
    item = parts["next"]
    parts["next"] = apply_operator(frame, operator.add, [item, parts["step"]])
    return item


def _repeat_next(frame, it, parts, state):
    if state["left"] is not None:
        if state["left"] == 0:
            return None
        state["left"] -= 1
    return parts["obj"]


def _compress_next(frame, it, parts, state):
    while (item := iter_next(frame, parts["data"])) is not None:
        selector = iter_next(frame, parts["selectors"])
        if selector is None:
            return None
        if truth(frame, selector):
            return item
    return None


def _filterfalse_next(frame, it, parts, state):
    while (item := iter_next(frame, parts["it"])) is not None:
        test = item if objects.is_same(parts["fn"], const(None)) else call(frame, parts["fn"], [item], {})
        if not truth(frame, test):
            return item
    return None


def _takewhile_next(frame, it, parts, state):
    if not state["active"]:
        return None
    item = iter_next(frame, parts["it"])
    if item is not None and truth(frame, call(frame, parts["fn"], [item], {})):
        return item
    state["active"] = False  # CPython's takewhile stops for good at the first failing item
    return None


def _dropwhile_next(frame, it, parts, state):
    while (item := iter_next(frame, parts["it"])) is not None:
        if not state["active"] or not truth(frame, call(frame, parts["fn"], [item], {})):
            state["active"] = False
            return item
    return None


def _starmap_next(frame, it, parts, state):
    item = iter_next(frame, parts["it"])
    return None if item is None else call(frame, parts["fn"], unpack_iterable(frame, item), {})


def _islice_next(frame, it, parts, state):
    if state["left"] == 0:
        return None
    for _ in range(state["skip"]):
        if iter_next(frame, parts["it"]) is None:
            state["left"] = 0
            return None
    item = iter_next(frame, parts["it"])
    if item is None:
        state["left"] = 0
        return None
    state["skip"] = state["step"] - 1
    if state["left"] is not None:
        state["left"] -= 1
    return item


_STEPS = {itertools.count: _count_next, itertools.repeat: _repeat_next, itertools.compress: _compress_next,
          itertools.filterfalse: _filterfalse_next, itertools.takewhile: _takewhile_next,
          itertools.dropwhile: _dropwhile_next, itertools.starmap: _starmap_next, itertools.islice: _islice_next}


# ---- rebuilding: the same itertools object in the same state ------------------------------------
def _rebuild(g, it):
    parts, state, kind = it.parts, it.state, it.kind
    make = g.const(kind, "ITERTOOLS")
    if kind is itertools.count:
        return f"{make}({g.value(parts['next'])}, {g.value(parts['step'])})"
    if kind is itertools.repeat:
        left = "" if state["left"] is None else f", {state['left']}"
        return f"{make}({g.value(parts['obj'])}{left})"
    if kind is itertools.compress:
        return f"{make}({g.value(parts['data'])}, {g.value(parts['selectors'])})"
    if kind is itertools.islice:
        left, skip, step = state["left"], state["skip"], state["step"]
        stop = None if left is None else skip + (left - 1) * step + 1 if left else 0
        return f"{make}({g.value(parts['it'])}, {skip if left != 0 else 0}, {stop}, {step})"
    if kind in (itertools.takewhile, itertools.dropwhile) and not state["active"]:
        # takewhile has stopped for good; dropwhile is past its prefix and drops nothing more
        rest = "()" if kind is itertools.takewhile else g.value(parts["it"])
        return f"{make}({g.const(_never, 'NEVER')}, {rest})"
    return f"{make}({g.value(parts['fn'])}, {g.value(parts['it'])})"


for _kind in _MAKERS:
    objects.CONSTRUCTORS[_kind] = lambda frame, args, kwargs, kind=_kind: _make(kind, frame, args, kwargs)
objects.ITERATOR_STEPS[ItertoolsIterator] = _next
glue.REBUILDERS[ItertoolsIterator] = _rebuild


# ---- tee: iterators over one shared buffer ------------------------------------------------------
_TEE = type(itertools.tee(())[0])
# whether tee() of a tee iterator hands that iterator itself back as its first result (CPython's C
# tee did; later versions copy it): asked of the running CPython, not of its version number
_TEE_HANDS_BACK_A_TEE = (lambda probe: itertools.tee(probe, 1)[0] is probe)(itertools.tee(())[0])


class TeeBuffer(Variable):
    """What a group of tee iterators share: the source iterator and the items read from it so far
    (CPython drops items every iterator has passed; keeping them changes nothing a program sees)."""

    def __init__(self, source):
        self.source, self.items, self.members = source, [], []


class TeeIterator(BaseIterator):
    """One of tee()'s iterators: its position in the shared buffer."""

    def __init__(self, buffer, pos):
        self.buffer, self.pos = buffer, pos
        buffer.members.append(self)

    def python_type(self):
        return _TEE


def _tee(frame, args, kwargs):
    iterable, n = _tee_arguments(args, kwargs)
    it = get_iter(frame, iterable)
    if n == 0:
        return TupleVariable([])
    if isinstance(it, TeeIterator):  # copies sharing its buffer from where it stands (first: itself, where CPython does so)
        first = [it] if _TEE_HANDS_BACK_A_TEE else []
        return TupleVariable(first + [TeeIterator(it.buffer, it.pos) for _ in range(n - len(first))])
    if hasattr(it.python_type(), "__copy__"):
        raise Unsupported(f"tee() of a {it.python_type().__qualname__}, which CPython copies with its __copy__",
                          kind="unsupported_call")
    buffer = TeeBuffer(it)
    return TupleVariable([TeeIterator(buffer, 0) for _ in range(n)])


def _tee_arguments(args, kwargs):
    if kwargs:
        e = TypeError("tee() takes no keyword arguments")
        raise Unsupported(str(e), python_exception=e)
    if not 1 <= len(args) <= 2:
        e = TypeError(f"tee expected at most 2 arguments, got {len(args)}" if args else
                      "tee expected at least 1 argument, got 0")
        raise Unsupported(str(e), python_exception=e)
    n = const_value(args[1], "tee's n") if len(args) == 2 else 2
    _native_check(itertools.tee, [[], n], {})  # (n's type and sign, judged by CPython)
    return args[0], n


def _tee_next(frame, it):
    buffer = it.buffer
    if it.pos == len(buffer.items):
        item = iter_next(frame, buffer.source)
        if item is None:
            return None
        buffer.items.append(item)
    it.pos += 1
    return buffer.items[it.pos - 1]


def _tee_root(items, source):
    """At run time: a tee iterator standing before `items` and then the rest of `source`; copies of it
    share its buffer, as the iterators tee() made in the frame share theirs."""
    return itertools.tee(itertools.chain(items, source), 1)[0]


def _tee_copy_at(root, n):
    return glue._advanced(copy.copy(root), n)


def _rebuild_tee_buffer(g, buffer):
    start = min(m.pos for m in buffer.members)  # (items every iterator has passed are not needed)
    items = "[" + "".join(f"{g.value(i)}, " for i in buffer.items[start:]) + "]"
    return f"{g.const(_tee_root, 'TEEROOT')}({items}, {g.value(buffer.source)})"


def _rebuild_tee(g, it):
    start = min(m.pos for m in it.buffer.members)
    return f"{g.const(_tee_copy_at, 'TEEAT')}({g.value(it.buffer)}, {it.pos - start})"


BUILTIN_HANDLERS[itertools.tee] = _tee
objects.ITERATOR_STEPS[TeeIterator] = _tee_next
glue.REBUILDERS[TeeBuffer] = _rebuild_tee_buffer
glue.REBUILDERS[TeeIterator] = _rebuild_tee
