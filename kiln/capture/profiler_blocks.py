"""Profiler blocks in a frame: `with torch.profiler.profile(): ...` and `with record_function(name):`.

torch.compile treats them as doing nothing inside a frame. kiln keeps them working without cutting
the graph: the block object is made and entered natively by the glue just before the graph call
(its constructor's arguments must be constants), and left just after the graph call in which its
block ends (or when the graph raises). The profiler so records the whole graph call in which a block
opens, up to the one in which it ends; the graph stays one graph. A break inside a block hands the
resume function a NativeExit on its stack (as a grad-mode block hands a GradModeExit). Registers
its models in objects, glue and graph_builder."""
import torch

from kiln.capture import glue, graph_builder, objects
from kiln.capture.objects import const_value
from kiln.capture.variables import NativeBlockVariable, NativeExit, ObjectVariable, const

BLOCK_CLASSES = (torch.profiler.profile, torch.autograd.profiler.profile, torch.autograd.profiler.record_function)


def _block(cls):
    def construct(frame, args, kwargs):
        why = f"an argument of {cls.__qualname__} (a profiler block's arguments must be constants)"
        return NativeBlockVariable(cls, tuple(const_value(a, why) for a in args),
                                   {k: const_value(v, why) for k, v in kwargs.items()})
    return construct


class BlockModel(objects.TypeModel):
    """A profiler block's attributes: a label's name and args (what its constructor stored); others
    change as the block runs, which happens outside the graph."""

    def attribute(self, frame, block, name):
        if block.cls is torch.autograd.profiler.record_function and name in ("name", "args"):
            return const(getattr(block.cls(*block.args, **block.kwargs), name))
        raise objects.Unsupported(f"attribute {name!r} of a {block.cls.__qualname__} block made in the frame")


def _rebuild_block(g, block):
    """A block made before a break but not entered in the graph: made again, natively."""
    return f"{g.const(block.cls, 'CLS')}(*{g.const(block.args, 'K')}, **{g.const(block.kwargs, 'K')})"


def _wrap_exit(og, value, source, guard):
    """A NativeExit handed to a resume function: guarded by type only (each call has its own block)."""
    if guard and source is not None:
        og.guards.type_match(source, value)
    return ObjectVariable(value, source)


for _cls in BLOCK_CLASSES:
    objects.CONSTRUCTORS[_cls] = _block(_cls)
objects.VARIABLE_MODELS[NativeBlockVariable] = BlockModel()
glue.REBUILDERS[NativeBlockVariable] = _rebuild_block
graph_builder.VALUE_WRAPPERS[NativeExit] = _wrap_exit
