"""Grad-mode objects beyond `with`: `torch.no_grad()(fn)` and the other decorator forms run torch's own
Python decorator code (_DecoratorContextManager.__call__) over capture's model of the mode, so the
wrapped function enters the mode on every call, as in eager. Registers its model in objects."""
import inspect
import types

from kiln.capture import objects
from kiln.capture.objects import TypeModel, call
from kiln.capture.variables import GradModeVariable, MethodVariable
from kiln.exc import Unsupported


class GradModeModel(TypeModel):
    def call(self, frame, mode, args, kwargs):
        return call(frame, self.attribute(frame, mode, "__call__"), args, kwargs)

    def attribute(self, frame, mode, name):
        if name in ("__enter__", "__exit__"):
            raise Unsupported("explicit __enter__/__exit__ calls")
        if name == "__class__":
            return frame.og.wrap(mode.cls, None, guard=False)
        raw = inspect.getattr_static(mode.cls, name, None)
        if isinstance(raw, types.FunctionType):  # clone, __call__: torch's Python code, run over the model
            return MethodVariable(raw, mode)
        raise Unsupported(f"attribute {name!r} of {mode.cls.__qualname__}")


objects.VARIABLE_MODELS[GradModeVariable] = GradModeModel()
