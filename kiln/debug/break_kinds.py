"""Why a graph broke, as a stable kind: the one registry that `kiln.Unsupported`, `kiln.explain`,
`KILN_LOGS=graph_breaks`, the compile report and tests all read.

A kind has a name (stable: tests and users match on it), an explanation in plain words and a hint
(what the user can change). A raise site names its kind (`Unsupported(msg, kind="print")`); one that
does not is classified by its message (`classify`), so every break has a kind, `other` at worst.
"""
import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class BreakKind:
    name: str
    explanation: str      # what happened, in plain words
    hint: str             # what the user can change
    patterns: tuple = ()  # regexes over a message of an untagged raise site


KINDS = {}


def _kind(name, explanation, hint, *patterns):
    KINDS[name] = BreakKind(name, explanation, hint, tuple(re.compile(p) for p in patterns))


# order matters for classification: the first kind whose pattern matches wins
_kind("data_dependent",
      "The code needs a tensor's value in Python (an `if` on a tensor, .item(), .tolist(), a shape that "
      "depends on the data). The graph is compiled for shapes, not values, so it stops there.",
      "Keep the decision inside torch (torch.where, masking), or set kiln.config.capture_scalar_outputs=True "
      "for .item(); move the check out of the compiled function if it is only a sanity check.",
      r"tensor's value", r"tensor data", r"item\(\)", r"data-dependent", r"needs? (the|its|their) (tensor's |array's )?data",
      r"data is needed", r"the truth of an array", r"`in` on a tensor", r"`in` over an array")
_kind("print_or_log",
      "print(), logging or warnings write to the outside world; a graph cannot replay that, so the call "
      "runs in plain Python between two graphs.",
      "Remove the print/log from the hot path, or log outside the compiled function.",
      r"^print\(\)", r"logging/warnings")
_kind("disabled_function",
      "The function was marked with kiln.disable: it runs eagerly, and the graph stops at its call.",
      "Remove kiln.disable if the function can be compiled.",
      r"kiln\.disable'd")
_kind("python_exception",
      "The captured code raised (or re-raised) a Python exception; kiln runs that path in plain Python.",
      "Avoid exceptions for control flow on the compiled path (check with `if` first).",
      r"\braised\b", r"re-raised", r"^\w*Error\b", r"^KeyError", r"^StopIteration", r"raise statement",
      r"bare raise", r"re-raising", r"raise \.\.\. from", r"missing (keyword )?argument", r"unexpected keyword",
      r"too many positional", r"multiple values for", r"values to unpack", r"unpacking \w+ values",
      r"referenced before assignment", r"is not defined", r"from empty", r"not in list", r"empty sequence",
      r"out of range", r"unexpected (arguments|fields)", r"bad arguments", r"needs field")
_kind("autograd_function",
      "A torch.autograd.Function kiln cannot trace as one graph node (its forward or backward does "
      "something kiln cannot replay: Python side effects, non-tensor results, in-place writes to inputs).",
      "Keep forward/backward to tensor operations, or call the Function outside the compiled region.",
      r"autograd\.Function", r"\bctx\.", r"\.backward (changes|returned)", r"\.forward (returned|writes)",
      r"implements both backward and vjp")
_kind("function_transform",
      "A torch.func transform (grad, vmap, ...) over a function kiln cannot trace as a pure tensor "
      "function (Python side effects, non-tensor results, arguments or in_dims it does not model).",
      "Keep the transformed function to tensor in, tensor out; call the transform outside the compiled "
      "region otherwise.",
      r"function made by", r"a function under", r"\bvmap\b")
_kind("runs_natively",
      "A library call kiln runs as itself around the graph on purpose (DistributedDataParallel's forward, "
      "torch.utils.checkpoint, a torch.distributed collective that talks to other ranks); what it calls "
      "in the program is still compiled.",
      "Nothing to fix: this break is by design. Fewer such calls in the hot path means fewer graphs.",
      r"runs natively", r"communicates with the other ranks", r"runs outside the graph",
      r"of a torch\.distributed call")
_kind("numpy",
      "NumPy code kiln cannot trace through torch (an array from outside the graph, a dtype or function "
      "without a torch counterpart).",
      "Use torch tensors in the compiled function, or convert arrays to tensors before calling it.",
      r"\bnumpy\b", r"\bndarray\b", r"NumPy", r"from_numpy", r"an array\b")
_kind("module_state",
      "The code creates, replaces or copies modules and parameters inside the compiled function; the "
      "graph would not see the new ones.",
      "Build modules before compiling; inside, only call them.",
      r"creating module", r"replacing a submodule", r"assigning a parameter", r"copy of module",
      r"overrides nn\.Module", r"__call__ is not a Python function", r"calling a module")
_kind("unsupported_call",
      "A call into code kiln cannot follow symbolically (a C extension, a library kiln does not model).",
      "Move the call out of the compiled function, or replace it with torch operations.",
      r"^call to ", r"^calling ", r"not traced through", r"is not modelled", r"not Python code",
      r"Python function argument", r"lru_cache", r"with arguments", r"without its receiver", r"os\.fspath",
      r"^type\(\) with 3", r"^vars\(\)", r"^iter\(callable", r"^id\(\)", r"weakref\.ref with a callback",
      r"of values capture does not know")
_kind("global_state",
      "The code changes process-wide state (autograd, hooks, global settings) that a graph cannot "
      "carry; that statement runs between graphs.",
      "Set such state once, outside the compiled function.",
      r"global state", r"global module hooks", r"backward hooks", r"requires_grad", r"autograd leaf",
      r"changes process state", r"file system")
_kind("unsupported_python",
      "A Python construct kiln's bytecode interpreter does not handle yet (an opcode, an intrinsic, a "
      "with-block over an unknown context manager, a generator protocol corner).",
      "Rewrite the construct more plainly, or report it: kiln aims to cover it.",
      r"opcode", r"CALL_INTRINSIC", r"with-block", r"generator", r"yield", r"async", r"__enter__",
      r"class body", r"super\(\)")
_kind("unsupported_object",
      "A value kiln cannot model or pass to the graph (an unknown object's attribute or method, a "
      "tensor subclass, a sparse tensor, an object with custom __setattr__ or __bool__).",
      "Pass plain tensors, numbers and containers of them; keep exotic objects outside the compiled region.",
      r"attribute", r"tensor subclass", r"sparse", r"__setattr__", r"__bool__", r"method ", r"constructing",
      r"object passed", r"cannot pass", r"descriptor", r"property", r"truth (value )?of",
      r"^(list|dict|set)\.", r"indexing", r"iterating over", r"next\(\) on", r"^operator ", r"`in` over",
      r"\*\* over", r"item assignment", r"^Tensor\.", r"setting Tensor", r"passed to a tensor op",
      r"^copy", r"copy\.", r"__new__", r"__next__ of", r"_replace", r"del on", r"^len\(\)", r"built from",
      r"a set whose iteration order", r"no known origin", r"whole contents of", r"tensor keys",
      r"cannot rebuild", r"changed size", r"of a function$", r"^\w+\.\w+$", r"^\w+(\.\w+)? on \w+$",
      r"slice with non-constant", r"changes after a class", r"with_traceback", r"\(\w+\)$")
_kind("tensor_data_assignment",
      "`t.data = v` that a graph cannot express: t made in the frame or computed with grad, data from "
      "another device or layout, or an op that needs t's gradient after its data was replaced.",
      "Assign .data outside the compiled function, or write `with torch.no_grad(): t.copy_(v)`.")
_kind("fake_tensor_failure",
      "A torch operation failed when run on fake tensors (shapes only): usually a shape error in the "
      "program, sometimes an op fake tensors do not support.",
      "Run the function eagerly on the same inputs: if it fails there too, fix the shapes.",
      r"failed on fake tensors", r"torch check", r"op returned", r"op result item", r"returned \w+, which capture",
      r"real tensor")
_kind("capture_limit",
      "Capture hit a safety limit (too many steps, too deep recursion, an unbounded loop).",
      "Unroll less in Python (loop over fewer items), or compile a smaller function.",
      r"too many steps", r"too deep", r"depth limit", r"too many (items|values)")
_kind("frame_runs_eagerly",
      "kiln could not resume after the break (a break inside a loop, try or with-block, a generator) "
      "so the whole function runs eagerly; the functions it calls are still compiled.",
      "Move the breaking statement out of the loop/with-block, or into a helper function.")
_kind("other",
      "A construct capture does not handle (no more specific kind applies).",
      "See the message; if the construct looks ordinary, report it.")


def classify(msg, python_exception=None):
    """The kind name of an untagged break from its message (and whether Python raised)."""
    if python_exception is not None:
        return "python_exception"
    for kind in KINDS.values():
        if any(p.search(msg) for p in kind.patterns):
            return kind.name
    return "other"


def get(name):
    return KINDS[name]


def describe(error):
    """A graph break as KILN_LOGS=graph_breaks prints it: the message, its kind, and what to do."""
    kind = KINDS[getattr(error, "kind", None) or "other"]
    where = f" (at {error.where})" if getattr(error, "where", None) and error.where not in error.msg else ""
    return f"graph break [{kind.name}]: {error.msg}{where}\n    why: {kind.explanation}\n    hint: {kind.hint}"
