"""An nn.Module subclass of the program's own constructed inside the frame from values only the frame
knows (`Matrix(torch.randn(10, 20))`): its __init__ is followed like any user class's, on an instance
whose attributes capture tracks, and the module is built after the graph: torch.nn.Module.__init__,
then each attribute set through nn.Module.__setattr__ (a submodule lands in _modules, a plain tensor
in __dict__, as in the frame).

Only what a module that holds no parameters or buffers of its own needs is modelled: nn.Module's
__init__, attribute reads and writes (properties first, as CPython does), and calling it (its
forward, with no hooks: a module made now has none, and the global ones are guarded absent). A new
Parameter, register_buffer and the other nn.Module methods that read its internal dicts stop the
graph. Registered in objects (SUBCLASS_CONSTRUCTORS, BUILTIN_HANDLERS, VARIABLE_MODELS)."""
import inspect
import types

import torch

from kiln.capture import objects
from kiln.capture.objects import TypeModel
from kiln.capture.variables import FreshObjectVariable, TensorVariable, const
from kiln.exc import Unsupported

_MODULE = torch.nn.Module
# what nn.Module.__init__ puts in an instance's __dict__: read or written only through its methods
_INTERNALS = frozenset(vars(_MODULE())) - {"training"}
_ATTRIBUTE_HOOKS = ("__getattr__", "__setattr__", "__delattr__", "__getattribute__", "__call__", "_call_impl")


_MISSING = object()


def _new_module(cls):
    module = object.__new__(cls)
    _MODULE.__init__(module)
    return module


class FreshModuleVariable(FreshObjectVariable):
    """An nn.Module made in the frame: `attrs` holds what its __init__ and later code set on it."""
    new_instance = staticmethod(_new_module)
    set_attribute = staticmethod(_MODULE.__setattr__)


def _followable(cls):
    """A class of the program's whose __init__ is Python code and whose attribute and call machinery
    is nn.Module's own (a class that replaces it would need that code followed instead)."""
    if cls.__module__.startswith("torch.") or cls.__new__ is not object.__new__:
        return False
    if not isinstance(inspect.getattr_static(cls, "__init__", None), types.FunctionType):
        return False
    return all(inspect.getattr_static(cls, name, None) is inspect.getattr_static(_MODULE, name, None)
               for name in _ATTRIBUTE_HOOKS)


def construct(frame, cls, args, kwargs):
    """`cls(*args)` followed through cls.__init__; None when the class is not one this models."""
    if not _followable(cls):
        return None
    frame.og.guards.class_unchanged(cls)  # its __init__, properties and forward as they are now
    module = FreshModuleVariable(cls)
    objects.call_python_function(frame, cls.__init__, [module] + list(args), kwargs)
    return module


def _module_init(frame, args, kwargs):
    """nn.Module.__init__(self) on a module made in the frame: its defaults are what a read finds
    when nothing was set (`training` is True); the real call happens when the module is built."""
    if not args or not isinstance(args[0], FreshModuleVariable):
        raise Unsupported("nn.Module.__init__ on a module from outside the frame", kind="module_state")
    if len(args) > 1 or kwargs:
        e = TypeError("Module.__init__() takes no arguments")
        raise Unsupported(f"TypeError: {e}", python_exception=e)
    return const(None)


class FreshModuleModel(TypeModel):
    def attribute(self, frame, var, name):
        if name in _INTERNALS:
            raise Unsupported(f"reading {name} of a module made in the frame (its internal state)", kind="module_state")
        if name not in var.attrs and name == "training" and \
                not isinstance(inspect.getattr_static(var.cls, name, None), property):
            return const(True)
        if name not in var.attrs and inspect.getattr_static(var.cls, name, _MISSING) is _MISSING:
            e = AttributeError(f"'{var.cls.__name__}' object has no attribute '{name}'")
            raise Unsupported(f"AttributeError: {e}", python_exception=e)
        return objects.fresh_attr(frame, var, name)

    def set_attribute(self, frame, var, name, value):
        if name in _INTERNALS:
            raise Unsupported(f"setting {name} of a module made in the frame (its internal state)", kind="module_state")
        if isinstance(value, TensorVariable) and issubclass(value.python_type(), torch.nn.Parameter):
            raise Unsupported("assigning a parameter during capture")
        objects.store_fresh_attr(frame, var, name, value)

    def call(self, frame, var, args, kwargs):
        objects.guard_no_global_module_hooks(frame.og)
        forward = self.attribute(frame, var, "forward")
        return objects.call(frame, forward, args, kwargs)

    def call_method(self, frame, var, name, args, kwargs):
        return objects.call(frame, self.attribute(frame, var, name), args, kwargs)


objects.SUBCLASS_CONSTRUCTORS[_MODULE] = construct
objects.BUILTIN_HANDLERS[_MODULE.__init__] = _module_init
objects.VARIABLE_MODELS[FreshModuleVariable] = FreshModuleModel()
