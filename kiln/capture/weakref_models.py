"""weakref.ref over values capture knows: calling an existing weak reference gives its referent
(reloaded and guarded through the call, so a referent that died since recompiles), and
`weakref.ref(x)` made in the frame gives back x when called (the frame keeps x alive). Registered in
objects.TYPE_MODELS / CONSTRUCTORS / VARIABLE_MODELS and glue.REBUILDERS."""
import weakref

from kiln.capture import glue, objects
from kiln.capture.objects import TypeModel
from kiln.capture.sources import ConvertedSource
from kiln.capture.variables import Variable, const
from kiln.exc import Unsupported


def _referent(ref):
    return ref()


class WeakRefVariable(Variable):
    """weakref.ref(x) made during capture: x's Variable, held strongly while the frame runs."""

    def __init__(self, referent):
        self.referent = referent

    def python_type(self):
        return weakref.ReferenceType


class ExistingWeakRefModel(TypeModel):
    def call(self, frame, ref, args, kwargs):
        if args or kwargs:
            raise Unsupported("a weak reference takes no arguments", python_exception=TypeError("weakref() args"))
        if ref.source is None:
            return objects.result_var(frame.og, ref.value())
        return frame.og.wrap(ref.value(), ConvertedSource(_referent, ref.source))


class MadeWeakRefModel(TypeModel):
    def call(self, frame, ref, args, kwargs):
        if args or kwargs:
            raise Unsupported("a weak reference takes no arguments", python_exception=TypeError("weakref() args"))
        return ref.referent

    def attribute(self, frame, ref, name):
        if name == "__class__":
            return frame.og.wrap(weakref.ReferenceType, None, guard=False)
        if name == "__callback__":
            return const(None)
        raise Unsupported(f"attribute {name!r} of a weak reference made in the frame")


def _make_ref(frame, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("weakref.ref with a callback")
    return WeakRefVariable(args[0])  # rebuilt as weakref.ref(x), which CPython shares per referent


objects.TYPE_MODELS[weakref.ReferenceType] = ExistingWeakRefModel()
objects.VARIABLE_MODELS[WeakRefVariable] = MadeWeakRefModel()
objects.CONSTRUCTORS[weakref.ReferenceType] = _make_ref
glue.REBUILDERS[WeakRefVariable] = lambda g, var: f"{g.const(weakref.ref, 'WEAKREF')}({g.value(var.referent)})"


def _key_of(ref):
    """The key weakref.ref(x) hashes as, for an existing x compared by identity (a WeakKeyDictionary's
    lookup): a real weak reference to it, equal to the one the dictionary holds while x lives."""
    x = ref.referent
    if isinstance(x, objects.ObjectVariable) and type(x.value).__eq__ is object.__eq__ and \
            type(x.value).__hash__ is object.__hash__:
        return weakref.ref(x.value)
    return None


objects.KEY_MAKERS[WeakRefVariable] = _key_of
