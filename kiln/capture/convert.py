"""Turn one frame (function object F, bound arguments L) into a cache entry.

Capture runs the interpreter; an Unsupported construct in the frame's own code restarts capture with
a graph break at that instruction (a break inside an inlined call breaks at the outermost call
site, so the callee runs — and is compiled — as a frame of its own). The result is compiled by the
backend and wrapped in generated glue; see glue.py and resume.py.
"""
import contextlib
import dis
import inspect
import os
import types
import warnings

import torch
import torch.fx

from kiln.config import config  # (the settings object: `kiln.config` names it once kiln is imported)
from kiln.capture import autograd_hooks
from kiln.capture import bytecode_facts as facts
from kiln.capture import capture_cache
from kiln.capture import interpreter as interp
from kiln.capture import rerun
from kiln.capture import user_backends
from kiln.capture import (autograd_function, class_creation, collections_models, container_subclasses,  # noqa: F401 (they register
                          context_managers, copy_models, exception_state, fresh_modules, function_objects, generator_models, itertools_models,
                          library_models, numpy_support, function_transforms, profiler_blocks, python_builtins,
                          weakref_models,
                          checkpoint_models, collectives_models, distributed_models)  # their models)
from kiln.capture.cache_entry import CacheEntry, log_entry, log_graph
from kiln.capture.glue import Glue
from kiln.capture.graph_builder import GradModeBreak, OutputGraph, shape_guards
from kiln.capture.interpreter import BINARY_OPS, COMPARE_OPS, UNARY_OPS, _LazyArg
from kiln.capture.objects import const_value
from kiln.capture.resume import live_locals, parameters, resume_code
from kiln.capture.sources import LocalSource
from kiln.capture.variables import ExitVariable, GradModeExit, NativeExit, NullVariable, ObjectVariable
from kiln.debug import break_kinds
from kiln.debug.logs import enabled, log
from kiln.distributed import ddp_buckets
from kiln.exc import BackendCompilerFailed, InternalError, KilnError, Unsupported

_JUMPS = facts.TRUTH_JUMPS
# single instructions a break can run natively in the glue: opname -> number of stack values popped
_NATIVE_OPS = {
    "BINARY_SUBSCR": 2, "COMPARE_OP": 2, "BINARY_OP": 2, "UNARY_NEGATIVE": 1, "UNARY_POSITIVE": 1,
    "UNARY_INVERT": 1, "UNARY_NOT": 1, "STORE_SUBSCR": 3, "STORE_ATTR": 2, "LOAD_ATTR": 1, "LOAD_METHOD": 1,
    "GET_ITER": 1, "CONTAINS_OP": 2, "BINARY_SLICE": 3, "STORE_SLICE": 4,
}
_CALLS = ("CALL", "CALL_KW", "CALL_FUNCTION_EX")
_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | \
    inspect.CO_ITERABLE_COROUTINE


class EagerFrame(Exception):
    """This frame cannot be captured safely; it runs natively (reason logged under graph_breaks)."""


class EagerCall(EagerFrame):
    """This call raises a Python exception out of the frame during capture (an assert, a raise on bad
    input): it runs eagerly and raises it, and later calls try capturing again."""


class _Break:
    """What the root frame was doing when capture stopped at a break."""

    def __init__(self, frame, inst, reason):
        self.frame, self.inst, self.reason = frame, inst, reason


class Capture:
    def __init__(self, F, L, code, fullgraph, dynamism, caller):
        self.F, self.L, self.code, self.fullgraph = F, L, code, fullgraph
        self.dynamism = dynamism
        # what the glue calls at a break: callees and resume functions, through the runtime (runtime.Caller)
        self.caller = caller
        self.break_at = None
        self.eager_rest = False  # the break's instruction and the rest of the frame run eagerly (no resume after it)
        self.break_reason = None
        self.requested = None
        self.requested_exits = []  # the with-blocks open at the requested break (their ExitVariables)
        self.steps = 0
        self.og = None

    def run(self):
        if self.code.co_flags & _GENERATOR_FLAGS:
            raise self._cannot("generators and coroutines run eagerly")
        for _ in range(3):
            self.og = OutputGraph(self.code.co_name, self.dynamism)
            self.steps, self.requested = 0, None
            frame = interp.root_frame(self, self.F, self.L, self.code)
            try:
                result = frame.run()
                if self.og.entered:
                    raise self._cannot("an autocast block still open at the end of the frame")
                return result
            except Unsupported as e:
                if self.fullgraph:
                    raise
                if self.requested is None:  # no instruction to break at (capture's own limits): run it natively
                    raise EagerFrame(f"{e.msg}; {self.code.co_qualname} runs eagerly") from e
                inst, _ = self.requested
                if e.python_exception is not None and (inst.opname in ("RAISE_VARARGS", "RERAISE")
                                                       or _escapes_frame(self.code, inst)):
                    raise EagerCall(f"{e.msg} at {e.where}: this call runs eagerly") from e
                why_not = _why_not_breakable(self.code, inst, self.requested_exits)
                if why_not and isinstance(e, GradModeBreak):  # with grad on at entry, it captures
                    raise EagerCall(f"{e.msg} at {e.where}: this call runs eagerly") from e
                self.eager_rest = bool(why_not) and self._rest_can_run_eagerly(inst)
                if why_not and not self.eager_rest:
                    raise EagerFrame(f"graph break at {e.where}: {e.msg}; frame runs eagerly: {why_not}") from e
                self.break_at, self.break_reason = inst.offset, _detached(e)
            finally:
                self.og.leave_contexts()
                self.og.frame = None  # (the frame holds the program's objects; what keeps og must not)
        raise EagerFrame("capture did not settle")

    def _rest_can_run_eagerly(self, inst):
        """A break at an instruction capture cannot resume after (BUILD_SLICE, ...): the graph so far is
        compiled and the frame continues eagerly from that instruction, as torch.compile does (its callees
        still compile); loops are no obstacle then (no resume function per iteration). Not with an empty
        graph: then the whole frame runs eagerly (a resume function starting there comes here too)."""
        return inst.opname not in _JUMPS and inst.opname not in _NATIVE_OPS and inst.opname not in _CALLS and \
            self.og.op_count() > 0 and _why_not_breakable(self.code, inst, self.requested_exits, eager_rest=True) is None

    def _cannot(self, msg):
        where = f"{self.code.co_filename}:{self.code.co_firstlineno}"
        if self.fullgraph:
            return Unsupported(msg, where=where)
        return EagerFrame(f"{msg} ({self.code.co_qualname} at {where})")

    def request_break(self, frame, inst, error):
        self.requested = (inst, error)
        self.requested_exits = [v for v in frame.stack if _is_exit(v)]

    def graph_break(self, frame, inst):
        return _Break(frame, inst, self.break_reason)


def _detached(error):
    """`error` without its traceback and chained exceptions: a cache entry keeps it (to say why the
    graph broke), and a traceback would keep capture's frames alive, and through them the program's
    objects (an optimizer and its state) for as long as the cache. The error keeps its message, place
    and the Python exception it stands for."""
    if error is None:
        return None
    for e in (error, error.python_exception):
        if e is not None:
            e.__traceback__ = e.__cause__ = e.__context__ = None
    return error


def _escapes_frame(code, inst):
    """Whether an exception that a call's callee raised during capture leaves the frame: no try or
    with block holds the call. Such a call runs eagerly, as torch.compile
    runs a frame whose trace raised: the trace may differ from the real run exactly where the code
    asks whether it is being compiled (Hugging Face's LongT5 leaves its attention mask None under
    compilation, and the call that reads it raises only in the trace), so a graph break that keeps
    the traced prefix and re-runs the raising call natively would raise where eager does not."""
    return inst.opname in _CALLS and not any(entry.start <= inst.offset < entry.end for entry in facts.exception_table(code))


def _why_not_breakable(code, inst, open_exits=(), eager_rest=False):
    """Why capture cannot break at `inst` and resume after it (None: it can). `eager_rest`: the frame
    would continue eagerly from `inst` instead, which needs no resume function per loop iteration."""
    if not eager_rest and inst.opname not in _JUMPS and inst.opname not in _NATIVE_OPS and inst.opname not in _CALLS:
        return f"cannot resume after {inst.opname}"
    insts, index_of = interp.instructions(code)
    for entry in facts.exception_table(code):
        if entry.start <= inst.offset < entry.end:
            # try/except/finally: the resume function keeps the handlers. A with-block would need its
            # context manager re-entered, which capture cannot do in general; a grad-mode block needs
            # only an exit that restores the mode, which the glue hands over on the stack.
            handler = insts[index_of[entry.target]:index_of[entry.target] + 3]
            with_body = any(i.opname == "WITH_EXCEPT_START" for i in handler)
            if with_body or _in_with_block(insts, inst.offset):
                if not (with_body and _only_grad_mode_blocks(insts, inst.offset, open_exits)):
                    return "the break is inside a with block"
                continue
            if entry.lasti:  # inside an except/finally handler: the exception being handled cannot be carried
                return "the break is inside an exception handler"
    normal = _normal_flow(insts, index_of)
    for i in insts if not eager_rest else ():
        if facts.is_backward_jump(i) and i.argval <= inst.offset < i.offset and i.offset in normal:
            return "the break is inside a loop"
    if inst.opname == "COMPARE_OP" and inst.argval not in COMPARE_OPS:
        return "unknown comparison"
    return None


def _normal_flow(insts, index_of):
    """Offsets reached from the code's start without an exception: a backward jump reached only
    through a handler is no loop (3.12+ put a with-block's cleanup after the function's body, and
    its jump back to the code after the block, when `__exit__` swallowed the exception, points
    backwards)."""
    seen, todo = set(), [0]
    while todo:
        k = todo.pop()
        if k >= len(insts) or insts[k].offset in seen:
            continue
        i = insts[k]
        seen.add(i.offset)
        if i.opcode in dis.hasjrel or i.opcode in dis.hasjabs:
            todo.append(index_of[i.argval])
        if i.opname not in facts.NO_FALLTHROUGH:
            todo.append(k + 1)
    return seen


def _only_grad_mode_blocks(insts, offset, open_exits):
    """Every with-block open at `offset` is a grad-mode block (no_grad, enable_grad, set_grad_enabled)
    or a profiler block: blocks whose exit the glue can hand to a resume function."""
    return len(open_exits) == _with_depth(insts, offset) and all(_is_grad_exit(e) for e in open_exits)


def _is_exit(v):
    """A with-block's exit on the stack: capture's own, or a grad-mode exit a resume function was given."""
    return isinstance(v, ExitVariable) or isinstance(v, ObjectVariable) and isinstance(v.value, (GradModeExit, NativeExit))


def _is_grad_exit(v):
    return isinstance(v, ObjectVariable) or v.restores is not None or v.native is not None


def _in_with_block(insts, offset):
    return _with_depth(insts, offset) > 0


def _with_depth(insts, offset):
    """How many BEFORE_WITHs before `offset` have not reached their exception handler yet."""
    depth = 0
    for i in insts:
        if i.offset >= offset:
            break
        if i.opname == "BEFORE_WITH":
            depth += 1
        elif i.opname == "WITH_EXCEPT_START" and depth:
            depth -= 1
    return depth


def compile_frame(F, L, code, backend, fullgraph, dynamism, caller):
    """-> CacheEntry. Raises EagerFrame, Unsupported (fullgraph) or BackendCompilerFailed. `caller` (a
    runtime.Caller) is what the glue calls at a break: the callees, and each resume function's cache.

    A bug in capture itself must never cost the user a wrong answer: it makes the frame run eagerly,
    or, under fullgraph=True (one graph or an error), raises InternalError (set KILN_DEBUG=1 to see
    the original exception raised instead).
    """
    try:
        with autograd_hooks.hidden():
            return _compile_frame(F, L, code, backend, fullgraph, dynamism, caller)
    except (EagerFrame, KilnError):
        raise
    except Exception as e:
        if os.environ.get("KILN_DEBUG"):
            raise
        msg = f"kiln internal error while capturing {code.co_qualname}: {type(e).__name__}: {e}"
        if fullgraph:
            raise InternalError(msg) from e
        raise EagerFrame(msg) from e


def _compile_frame(F, L, code, backend, fullgraph, dynamism, caller):
    cap = Capture(F, L, code, fullgraph, dynamism, caller)
    backend = ddp_buckets.backend_for_frame(backend)  # the graph only: resume functions keep `backend`
    result = cap.run()
    og = cap.og
    glue = Glue(og)
    try:
        if isinstance(result, _Break):
            glue.at_break = True
            tail, reason = _break_tail(cap, glue, result)
        else:
            ret = glue.value(result)
            glue.replay_side_effects()
            tail, reason = [f"return {ret}"], None
    except Unsupported as e:  # a value the glue cannot rebuild in Python (a grad-mode object not entered yet)
        if fullgraph:
            raise
        raise EagerFrame(f"{e.msg}; {code.co_qualname} runs eagerly") from e
    og.watch.note(f"the values {code.co_qualname} returns or passes on")
    if _only_grad_mode_switches(og.graph):  # no computation: no graph, the switch runs natively
        for node in [n for n in og.graph.nodes if n.op == "call_function"]:
            og.graph.erase_node(node)
        if og.grad_enabled != og.grad_at_entry:
            tail = [f"{glue.const(torch._C._set_grad_enabled, 'SETGRAD')}({og.grad_enabled})"] + tail
    graph_fn, gm = _compile_graph(og, glue, backend, code)
    og.watch.note(f"backend {backend.name!r} compiling the graph of {code.co_qualname}")
    run, glue_src = glue.function(graph_fn, [s for s, _, _ in og.inputs] if graph_fn else [], tail,
                                  rerun=rerun.can_rerun(og, code))
    og.watch.check_marked()
    og.guard_input_aliasing()
    for expr in shape_guards(og):
        og.guards.add(None, expr, expr)
    check, first_failure, guard_src = og.guards.build()
    entry = CacheEntry(check, run, list(og.guards.guards), first_failure, gm, _detached(reason), glue_src, guard_src,
                       og.input_values(), og.guards.liveness,
                       capture_cache.stored_form(og, glue, graph_fn, gm, glue_src, backend, code,
                                                 cap.caller))
    log_entry(code, entry)
    return entry


def _compile_graph(og, glue, backend, code):
    og.graph.output(tuple(v.node for v in glue.outputs))
    _drop_unused_sizes(og.graph)
    if og.op_count() == 0:
        return None, None
    gm = torch.fx.GraphModule(torch.nn.Module(), og.graph)
    log_graph(code, gm)
    try:
        # in the mode the graph starts in, which it gets back after: tracing a graph through its grad
        # switches (make_fx runs torch._C._set_grad_enabled for real) must not leave one switched
        with torch.set_grad_enabled(og.grad_at_entry):
            if user_backends.is_user_backend(backend):
                compiled = user_backends.compile_graph(backend, gm, og)
            else:
                compiled = backend(gm, user_backends.example_inputs(og, False))
    except Exception as e:
        if config.suppress_errors:
            warnings.warn(f"kiln: backend {backend.name!r} raised {type(e).__name__}: {e}; "
                          f"running {code.co_qualname} eagerly")
            raise EagerFrame(f"backend {backend.name!r} failed: {e}") from e
        raise BackendCompilerFailed(backend.name, e) from e
    return compiled, gm


def _only_grad_mode_switches(graph):
    calls = [n for n in graph.nodes if n.op.startswith("call")]
    return bool(calls) and all(n.target is torch._C._set_grad_enabled for n in calls)


def _drop_unused_sizes(graph):
    """Remove size computations nothing uses (`x.size()` whose result the glue recomputes from the
    inputs): a graph of nothing else is no graph, as in torch.compile. Only nodes whose value is a
    number or a tuple of numbers go: tensor ops may write in place, so they always stay."""
    for node in reversed(graph.nodes):
        if node.op in ("call_function", "call_method") and not node.users and \
                _is_number_tree(node.meta.get("example_value")):
            graph.erase_node(node)


def _is_number_tree(value):
    if isinstance(value, (tuple, list)):
        return bool(value) and all(_is_number_tree(v) for v in value)
    return isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _break_tail(cap, glue, brk):
    """Lines that run the breaking construct natively and call the resume function(s).

    Inside a try block the native part is wrapped so that an exception continues at the frame's
    own handler (a resume function at the handler offset), exactly as CPython unwinds.
    """
    frame, inst = brk.frame, brk.inst
    stack = list(frame.stack)
    insts, index_of = frame.insts, frame.index_of
    next_offset = insts[index_of[inst.offset] + 1].offset if index_of[inst.offset] + 1 < len(insts) else None
    _log_break(brk.reason)
    caller = glue.const(cap.caller, "CALL")
    resume = lambda below, offset, extra: _resume_call(cap, glue, frame, below, offset, extra)  # noqa: E731

    if cap.eager_rest:  # the instruction itself starts the rest, which runs eagerly
        native, after = [], [resume(stack, inst.offset, [])]
    elif inst.opname in _JUMPS:
        value, below = stack[-1], stack[:-1]
        v = glue.value(value)
        jumps_if, keep = _JUMPS[inst.opname]
        taken = resume(below + [value] if keep else below, inst.argval, [])
        fallthrough = resume(below, next_offset, [])
        native = [f"__c = {'' if jumps_if else 'not '}{v}"]
        after = ["if __c:", f"    {taken}", fallthrough]
    else:
        if inst.opname in ("CALL", "CALL_KW"):
            n = inst.arg
            if inst.opname == "CALL_KW":  # 3.13: the keyword names sit on top of the arguments
                kw_names, stack = const_value(stack[-1]), stack[:-1]
            else:
                kw_names = frame.kw_names or ()
            below = stack[:len(stack) - n - 2]
            fn, pos, kws = interp.call_parts(stack[len(stack) - n - 2:], kw_names)
            parts = [glue.value(fn)] + [glue.value(a) for a in pos] + \
                [f"{k}={glue.value(v)}" for k, v in kws.items()]
            native, pushed, push_null = [f"__r = {caller}({', '.join(parts)})"], True, False
        elif inst.opname == "CALL_FUNCTION_EX":
            has_kw = inst.arg & 1
            kw = stack[-1] if has_kw else None
            args = stack[-1 - has_kw]
            below = stack[:len(stack) - 3 - has_kw]
            fn, bound_self = facts.callable_and_self(*stack[len(below):len(below) + 2], is_null=interp.is_null)
            star = "*" + glue.value(args)
            if bound_self is not None:
                star = f"*(({glue.value(bound_self)},) + tuple({glue.value(args)}))"
            parts = [glue.value(fn), star] + (["**" + glue.value(kw)] if kw is not None else [])
            native, pushed, push_null = [f"__r = {caller}({', '.join(parts)})"], True, False
        else:
            npop = _NATIVE_OPS[inst.opname]
            below = stack[:len(stack) - npop]
            ops = [glue.value(o) for o in stack[len(stack) - npop:]]
            line, pushed, push_null = _native_op_line(glue, inst, ops)
            native = [line]
        result = [_Native("__r")] if pushed else []
        if push_null:
            result = facts.with_null(result[0], interp.NULL)
        after = [resume(below + result, next_offset, [])]
    if any(_is_exit(v) for v in stack) or cap.og.grad_enabled != cap.og.grad_at_entry:
        # inside a grad-mode block, or after a switch (an aot backend's graph does not switch the real
        # mode): the construct and the rest run in the mode capture was in there
        native = [f"{glue.const(torch._C._set_grad_enabled, 'SETGRAD')}({cap.og.grad_enabled})"] + native
    handler = _covering_handler(frame.code, inst.offset)
    if handler is not None and native:
        exc_stack = stack[:handler.depth]
        extra = ([repr(inst.offset)] if handler.lasti else []) + ["__e"]
        on_error = resume(exc_stack, handler.target, extra)
        native = ["try:"] + ["    " + line for line in native] + \
            ["except BaseException as __e:", f"    {on_error}"]
    glue.replay_side_effects()
    return native + after, brk.reason


def _covering_handler(code, offset):
    for entry in facts.exception_table(code):
        if entry.start <= offset < entry.end:
            return entry
    return None


def _native_op_line(glue, inst, ops):
    name = inst.opname
    if name == "BINARY_SUBSCR":
        return f"__r = {ops[0]}[{ops[1]}]", True, False
    if name == "BINARY_OP":
        return f"__r = {glue.const(BINARY_OPS[inst.arg], 'OP')}({ops[0]}, {ops[1]})", True, False
    if name == "COMPARE_OP":
        return f"__r = {glue.const(COMPARE_OPS[inst.argval], 'OP')}({ops[0]}, {ops[1]})", True, False
    if name in UNARY_OPS:
        return f"__r = {glue.const(UNARY_OPS[name], 'OP')}({ops[0]})", True, False
    if name == "STORE_SUBSCR":
        return f"{ops[1]}[{ops[2]}] = {ops[0]}", False, False
    if name == "STORE_ATTR":
        return f"{ops[1]}.{inst.argval} = {ops[0]}", False, False
    if name in ("LOAD_ATTR", "LOAD_METHOD"):
        return f"__r = {ops[0]}.{inst.argval}", True, facts.loads_method(inst)
    if name == "GET_ITER":
        return f"__r = iter({ops[0]})", True, False
    if name == "BINARY_SLICE":
        return f"__r = {ops[0]}[{ops[1]}:{ops[2]}]", True, False
    if name == "STORE_SLICE":
        return f"{ops[1]}[{ops[2]}:{ops[3]}] = {ops[0]}", False, False
    if name == "CONTAINS_OP":
        return f"__r = ({ops[0]} {'not in' if inst.arg else 'in'} {ops[1]})", True, False
    raise AssertionError(name)


def _resume_call(cap, glue, frame, below, offset, extra):
    """`return <resume function at offset>(stack below..., extra..., live locals...)` through the runtime."""
    code = frame.code
    stack_nulls = [isinstance(v, NullVariable) for v in below] + [False] * len(extra)
    live = [n for n in code.co_varnames if n in live_locals(code, offset) and n in frame.locals]
    stack_vals = [v.expr if isinstance(v, _Native) else glue.value(v) for v in below if not isinstance(v, NullVariable)]
    local_vals = [_local_expr(glue, frame.locals[n]) for n in live]
    for n in code.co_cellvars:
        frame.cells.setdefault(n, interp.CellVariable())
    cell_vals = [glue.value(frame.cells[n]) for n in code.co_cellvars]
    rcode = resume_code(code, offset, stack_nulls, live)
    if enabled("bytecode"):
        log("bytecode", "resume function %s:\n%s", rcode.co_name, _dis(rcode))
    rcache = glue.const(cap.caller.resume_cache(rcode), "RESUME")
    closure = "None"
    if code.co_freevars or code.co_cellvars:
        cells = "".join(c + ", " for c in cell_vals)
        closure = f"(F.__closure__ or ()) + ({cells})" if code.co_freevars else f"({cells})"
    stack_names, params = parameters(code, stack_nulls, live)
    values = dict(zip(stack_names, stack_vals + list(extra))) | dict(zip(live, local_vals))
    args = "(" + "".join(values[p] + ", " for p in params) + ")"
    return (f"return {rcache}({glue.const(types.FunctionType, 'FN')}({glue.const(rcode, 'RCODE')}, "
            f"F.__globals__, {rcode.co_name!r}, None, {closure}), {args})")


class _Native:
    """A stack slot after the break holding what the native part computed (`expr` names it)."""

    def __init__(self, expr):
        self.expr = expr


def _local_expr(glue, v):
    if isinstance(v, _LazyArg):
        return LocalSource(v.index, v.name).expr(glue.ctx)
    return glue.value(v)


def _dis(code):
    import io
    out = io.StringIO()
    dis.dis(code, file=out)
    return out.getvalue()


def _log_break(reason):
    if enabled("graph_breaks"):
        log("graph_breaks", "%s", break_kinds.describe(reason))
