"""The three ways a workload runs: eager PyTorch, kiln, and torch.compile (the peer).

kiln and torch.compile get the same arguments (backend name, dynamic) and their default settings
otherwise, so anyone with the same torch version can reproduce the torch.compile numbers.
"""
import copy
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Compiler:
    name: str                                   # the key used on the command line and in JSON
    label: str                                  # the column heading
    wrap: Callable[[Callable, "object"], Callable]  # (model, workload) -> compiled callable
    reset: Callable[[], None]                   # forget every compiled entry (between workloads)


def _eager(model, workload):
    return model


def _kiln(model, workload):
    import kiln
    return kiln.compile(model, backend=workload.backend, dynamic=workload.dynamic)


def _kiln_reset():
    import kiln
    kiln.reset()


def _torch(model, workload):
    return torch.compile(model, backend=workload.backend, dynamic=workload.dynamic)


def _torch_reset():
    torch._dynamo.reset()


EAGER = Compiler("eager", "eager", _eager, lambda: None)
COMPILERS = {c.name: c for c in (
    EAGER,
    Compiler("kiln", "kiln", _kiln, _kiln_reset),
    Compiler("torch", "torch.compile", _torch, _torch_reset),
)}


def prepare(compiler, model, workload):
    """The callable to time: a private copy of the model (so parameters, grads and buffers of one compiler
    never touch another's), wrapped by the compiler."""
    own = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    return compiler.wrap(own, workload)
