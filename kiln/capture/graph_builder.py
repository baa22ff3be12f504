"""The graph being built for one captured frame: fx.Graph + fake tensors + guards + side effects.

Every value entering from the outside goes through `wrap(value, source)`, which picks its Variable
and installs the guards it needs; every tensor op goes through `call_op`, which runs the op on fake
tensors (FakeTensorMode) to learn the result's metadata and records an fx node.
"""
import builtins
import collections
import contextlib
import enum
import functools
import operator
import re
import sys
import types
import weakref

import sympy
import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           FakeTensorMode)
from torch.fx.experimental.symbolic_shapes import (DimDynamic, PendingUnbackedSymbolNotFound, ShapeEnv,
                                                   compute_unbacked_bindings, free_unbacked_symbols)
from torch.utils import _pytree as pytree

from kiln.capture import dynamic, odict_order
from kiln.capture.guards import GuardSet, module_attribute
from kiln.capture.shape_watch import ShapeWatch
from kiln.capture.side_effects import SideEffects
from kiln.capture.user_files import is_user_file
from kiln.capture import user_lines
from kiln.capture.sources import AttrSource, ConstSource, GlobalSource, ItemSource
from kiln.capture.variables import (ConstantVariable, DequeVariable, DictVariable, ListVariable, ObjectVariable,
                                    RuntimeFunctionVariable, SetVariable, SliceVariable, SymNodeVariable, TensorKey,
                                    TensorVariable, TupleVariable, Variable, is_constant)
import torch._guards
from kiln.exc import Unsupported
from kiln import torch_compat
from kiln.torch_compat import UnmanagedAutocast, forget_item_value

# What the fake mode raises for a data-dependent op when it has no ShapeEnv
_NEEDS_SHAPE_ENV = (DataDependentOutputException, DynamicOutputShapeException)

# Python modules whose attributes are treated as fixed (no guard on `torch.nn.functional.relu`)
_LIBRARY_PREFIXES = ("torch", "math", "operator", "builtins", "functools", "itertools", "collections",
                     "typing", "numpy", "inspect", "warnings", "logging", "enum", "dataclasses", "abc",
                     "copy", "types", "transformers", "contextlib", "sys", "os", "re")


def is_library_module(mod):
    name = getattr(mod, "__name__", "") or ""
    return name.split(".")[0] in _LIBRARY_PREFIXES


# Types whose existing values another module wraps (numpy_support: ndarrays): type -> fn(og, value,
# source, guard) -> Variable. They register here, so this module imports none of them.
VALUE_WRAPPERS = {}
SUBCLASS_WRAPPERS = {}  # builtin base (list) -> fn(og, value, source, guard) for instances of its subclasses, or None


class GradModeBreak(Unsupported):
    """A tensor that requires grad made while grad is switched on in a graph that starts with it off
    (a resume function after a no_grad block, enable_grad in a frame called under no_grad): the graph
    ends before that op, because aot-based backends trace a graph in the grad mode it starts in and
    would lose its requires_grad and grad_fn. Switching grad on alone, and ops on tensors that need
    no grad, compute the same values in either mode, so they stay in the graph."""


class ShapeSource(torch._guards.Source):
    """Names a dynamic input for the ShapeEnv: its name is the guard expression that reloads it."""

    def __init__(self, expr):
        self.expr = expr

    @property
    def name(self):
        return self.expr

    def guard_source(self):
        return torch._guards.GuardSource.LOCAL

    def reconstruct(self, codegen):
        raise NotImplementedError

    def __hash__(self):
        return hash(self.expr)

    def __eq__(self, other):
        return isinstance(other, ShapeSource) and other.expr == self.expr


class OutputGraph:
    def __init__(self, code_name, dynamism=None):
        """`dynamism` (dynamic.InputDynamism) says which input sizes and numbers are symbolic."""
        self.set_order_reads = SetVariable.order_reads  # (capture_cache: was a set's order read since?)
        self.graph = self.root_graph = torch.fx.Graph()  # `graph` is where ops go; see `subgraph`
        # The ShapeEnv comes into being only when a size turns symbolic (see `shape_env`): creating
        # one imports torch's validator and, through it, most of torch._dynamo (~0.75 s in a fresh
        # process), which a graph with static sizes never needs. static_shapes=False is what the
        # mode would have with a ShapeEnv from the start.
        self._shape_env = None
        self.fake_mode = FakeTensorMode(shape_env=None, static_shapes=False, allow_non_fake_inputs=False)
        self.dynamism = dynamism or dynamic.InputDynamism(False, code_name)
        self.watch = ShapeWatch(None)
        self.dynamic_inputs = []  # (fake tensor or symbolic number, ShapeSource)
        self.dynamic_input_dims = {}  # id(fake) -> dims made symbolic
        self.shape_source_of = {}  # ShapeSource -> the Source of that dynamic input
        self.guards = GuardSet()
        self.side_effects = SideEffects()
        # the __traceback__ of exceptions raised or given one during capture: id -> (the exception,
        # kept alive; its traceback's Variable), see tracebacks.py
        self.tracebacks = {}
        # the exception the compiled function's caller is handling, read now: capture starts in no
        # except block of kiln's own (later, kiln code handling its own exceptions may call user code)
        self.caller_exception = sys.exc_info()[1]
        self.native_enters = []  # profiler blocks the glue enters before the graph call (profiler_blocks.py)
        self.native_exits = []   # ... and the exits it calls after it, in order
        self.inputs = []  # (source, real tensor or number, node) in placeholder order
        self._input_versions = []  # per tensor input: (fake, its version counter on entry): a change means a write
        self.folded_numbers = []  # (source, value) of the caller's ints/floats folded in as constants
        self._numbers = {}  # Source -> SymNodeVariable of a symbolic number input
        self._by_id = {}  # id(real object) -> Variable, so one object always maps to one Variable
        self._keepalive = []
        self._runtime_functions = {}  # code -> the RuntimeFunctionVariables of it (distinct objects)
        self._names = set()
        self._next_suffix = {}  # base name -> the next suffix to try (_unique)
        self.code_name = code_name
        self.frame = None  # the interpreter frame running now: each node records its user line
        self.hook_globals_guarded = False
        self.entered = []  # real autocast modes entered during capture (left again in any case)
        self.grad_enabled = torch.is_grad_enabled()
        self.grad_at_entry = self.grad_enabled
        self.guards.add(None, f"{self.guards.const(torch.is_grad_enabled, 'GRAD')}() is {self.grad_enabled}",
                        f"torch.is_grad_enabled() is {self.grad_enabled}")
        self.guards.autocast_match()

    @property
    def shape_env(self):
        """The frame's ShapeEnv, created (and handed to the fake mode) on first use."""
        return self.ensure_shape_env()

    def ensure_shape_env(self):
        if self._shape_env is None:
            self._shape_env = ShapeEnv()
            self.fake_mode.shape_env = self._shape_env
            self.watch.env = self._shape_env
        return self._shape_env

    # ---- values from outside --------------------------------------------------------------------
    def wrap(self, value, source, guard=True):
        """The Variable for an existing object reached through `source`, with its guards."""
        if isinstance(value, Variable):  # put into a real object capture made (a StopIteration's value)
            return value
        known = self._by_id.get(id(value))
        if known is not None and not is_constant(value):
            if guard and source is not None and known.source is None:
                known = None  # first met unguarded (a staticmethod, a folded result): this source needs guards
            else:
                if guard and source is not None and known.source != source:
                    self.guards.aliases(source, known.source)
                return known
        var = self._wrap_new(value, source, guard)
        if not is_constant(value):
            self._by_id[id(value)] = var
            self._keepalive.append(value)
        return var

    def _wrap_new(self, value, source, guard):
        g = self.guards if (guard and source is not None) else None
        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(value, source)
        wrapper = VALUE_WRAPPERS.get(type(value))
        if wrapper is not None:
            return wrapper(self, value, source, guard)
        if is_constant(value):
            if g and source in self._numbers:
                return self._numbers[source]
            if g and self.dynamism.scalar(source, value):
                return self._wrap_number(value, source)
            if g:
                g.const_match(source, value)
                if type(value) in (int, float):
                    self.folded_numbers.append((source, value))
            return ConstantVariable(value, source)
        if type(value) in (list, tuple) or (isinstance(value, tuple) and hasattr(value, "_fields")):
            if g:
                g.len_match(source, value)
                g.class_unchanged(type(value))  # a NamedTuple's own methods and dunders
            items = [self.wrap(v, ItemSource(source, i) if source else None, guard) for i, v in enumerate(value)]
            if type(value) is list:
                return ListVariable(items, source)
            return TupleVariable(items, source, type(value))
        if type(value) is collections.deque:
            if g:
                g.len_match(source, value)
                g.add(source, f"v.maxlen == {value.maxlen!r}", f"{source!r}.maxlen == {value.maxlen!r}")
            items = [self.wrap(v, ItemSource(source, i) if source else None, guard) for i, v in enumerate(value)]
            return DequeVariable(items, source, value.maxlen)
        if type(value) in _DICT_TYPES and all(_stable_key(k) or isinstance(k, torch.Tensor) for k in value) and \
                len(value) == len(list(value)):  # (an OrderedDict that dict's own methods changed iterates fewer)
            if g:
                g.keys_match(source, value)
                if type(value) is collections.OrderedDict:  # its storage order too (dict's own methods read it)
                    g.storage_order_match(source, value)
            get = value.__getitem__ if type(value) is types.MappingProxyType else functools.partial(dict.__getitem__, value)
            items = {self._dict_key(k): self.wrap(get(k), ItemSource(source, k) if source else None, guard)
                     for k in value}  # (dict's own lookup: a subclass's __getitem__ or __missing__ is not run)
            d = DictVariable(items, source, type(value))
            if type(value) is collections.OrderedDict:
                odict_order.from_input(d, [self._dict_key(k) for k in dict.keys(value)])
            if type(value) is collections.defaultdict:
                d.default_factory = self.wrap(value.default_factory,
                                              AttrSource(source, "default_factory") if source else None, guard)
            return d
        if _is_numpy_scalar(value):  # torch treats them as Python numbers: guard the value, fold the number
            if g:
                g.const_match(source, value)
            return ConstantVariable(value.item(), source)
        if type(value) is set and all(is_constant(k) for k in value):
            return self._wrap_set(value, source, g)
        if isinstance(value, types.ModuleType):
            # user modules, and the user's own global names for library modules (`torch` could be
            # rebound), are checked by identity; library internals' imports are trusted
            if g and (not is_library_module(value) or isinstance(source, GlobalSource) and source.root):
                g.id_match(source, value)
            return ObjectVariable(value, source)
        if g and _made_at_run_time(value):
            return self._wrap_runtime_function(value, source, g)
        if isinstance(value, (torch.nn.Module, types.FunctionType, types.BuiltinFunctionType, type,
                              types.MethodType, types.MethodWrapperType, types.WrapperDescriptorType,
                              types.MethodDescriptorType, types.CellType)) or callable(value) and _is_library_object(value):
            if g:
                if isinstance(value, types.MethodType):
                    g.id_match(AttrSource(source, "__func__"), value.__func__)
                    self.wrap(value.__self__, AttrSource(source, "__self__"))
                elif isinstance(value, types.BuiltinMethodType) and not isinstance(value.__self__, (types.ModuleType, type(None))):
                    # a C method bound to an object is a new object on every read: compare by == (the
                    # same method of the same object)
                    g.add(source, f"v == {g.const(value, 'BM')}", f"{source!r} is {value!r}")
                else:
                    g.id_match(source, value)
                if isinstance(value, torch.nn.Module):  # its methods, __call__, attribute lookup order
                    g.class_unchanged(type(value))
            return ObjectVariable(value, source)
        for base in type(value).__mro__[1:]:  # an instance of a list/tuple/dict subclass (container_subclasses)
            if (wrapper := SUBCLASS_WRAPPERS.get(base)) is not None:
                if (var := wrapper(self, value, source, guard)) is not None:
                    return var
                break
        if isinstance(value, enum.Enum):  # members are singletons: identity says everything
            if g:
                g.id_match(source, value)
            return ObjectVariable(value, source)
        if g:
            g.type_match(source, value)
            g.class_unchanged(type(value))  # what capture reads through the object's class
        return ObjectVariable(value, source, opaque=g is not None)

    def _wrap_runtime_function(self, fn, source, g):
        g.code_match(source, fn)
        same_code = self._runtime_functions.setdefault(fn.__code__, [])
        for other in same_code:  # another object of the same code (one object through two sources: aliases)
            g.distinct(source, other.source)
        var = RuntimeFunctionVariable(fn, source, lambda: g.id_match(source, fn))
        same_code.append(var)
        return var

    def _dict_key(self, key):
        """The key a DictVariable stores for a key of an existing dict (a tensor key: by identity)."""
        if isinstance(key, torch.Tensor):
            return TensorKey(self.wrap(key, ConstSource(key)))
        return key

    def _wrap_set(self, value, source, g):
        """A set of constants: guarded on its items in their iteration order (which the code may see)."""
        keys = value.copy()
        if list(keys) != list(value):  # a table grown by deletions: a copy iterates in another order
            raise Unsupported("a set whose iteration order capture cannot reproduce")
        if g:
            g.add(source, f"type(v) is set and tuple(v) == {g.const(tuple(value), 'K')}",
                  f"{source!r} == {value!r} in this order")
        return SetVariable([(k, ConstantVariable(k)) for k in keys], source, keys=keys)

    def _wrap_tensor(self, value, source):
        if source is None:
            raise Unsupported("a tensor with no known origin cannot enter the graph")
        if type(value) not in (torch.Tensor, torch.nn.Parameter, torch.nn.parameter.Buffer) and \
                not isinstance(value, torch.nn.Parameter):
            raise Unsupported(f"tensor subclass {type(value).__qualname__} is not supported", kind="unsupported_object")
        if value.is_sparse or value.layout != torch.strided:
            raise Unsupported("sparse tensors are not supported", kind="unsupported_object")
        dims = self.dynamism.dims(source, value) if value.dim() else {}
        if dims:
            self.ensure_shape_env()  # the fake mode makes this input's sizes symbols of it
            self.guards.tensor_match(source, value, dynamic=set(dims))
            shape_source = ShapeSource(source.expr(self.guards.ctx))
            fake = forget_item_value(self.fake_mode.from_tensor(
                value, symbolic_context=dynamic.symbolic_context(value, dims), source=shape_source))
            self.dynamic_inputs.append((fake, shape_source))
            self.shape_source_of[shape_source] = source
            self.dynamic_input_dims[id(fake)] = set(dims)
            self.watch.add_input(fake, source, dims, dynamic.marked_bounds(value))
        else:
            self.guards.tensor_match(source, value)
            fake = forget_item_value(self.fake_mode.from_tensor(value, static_shapes=True))
        name = self._unique(_sanitize(repr(source).replace("G['__kiln_target__']", "self")))
        node = self._placeholder(name)
        node.meta["example_value"] = fake
        node.meta["source"] = repr(source)
        # a parameter or buffer of a module: what freezing=True may treat as a constant
        node.meta["module_state"] = dynamic.is_module_state(value, source)
        self.inputs.append((source, value, node))
        self._input_versions.append((fake, version_of(fake)))
        return TensorVariable(node, fake, source, type(value))

    def _wrap_number(self, value, source):
        """An int or float the caller passes, as a graph input: a symbol (backed by its value) in the
        ShapeEnv, so one graph serves every value; the shape guards keep the facts the code relied on."""
        env = self.ensure_shape_env()
        self.guards.type_match(source, value)
        shape_source = ShapeSource(source.expr(self.guards.ctx))
        sym = env.create_unspecified_symbol(value, source=shape_source, dynamic_dim=DimDynamic.DYNAMIC)
        make = env.create_symintnode if type(value) is int else env.create_symfloatnode
        symbolic = make(sym, hint=value, source=shape_source)
        node = self._placeholder(self._unique(_sanitize(repr(source))))
        node.meta["example_value"] = symbolic
        node.meta["source"] = repr(source)
        self.inputs.append((source, value, node))
        self.dynamic_inputs.append((symbolic, shape_source))
        self.shape_source_of[shape_source] = source
        self._numbers[source] = SymNodeVariable(node, symbolic)
        return self._numbers[source]

    def input_values(self):
        """(Source, what automatic dynamic compares next time): each tensor input's sizes and each
        number folded in as a constant."""
        return [(s, tuple(t.shape)) for s, t, _ in self.inputs if isinstance(t, torch.Tensor)] + \
            list(self.folded_numbers)

    def rebind_tensor(self, var, node, fake):
        """`var`, a tensor from outside the frame whose .data was assigned, reads as `node` (`fake`)
        from now on; the glue still hands back the object its source names."""
        self._keepalive.append(var.fake)  # (its id keys nothing new while the capture lasts)
        self.side_effects.rekey_attrs(var.fake, fake)
        var.node, var.fake, var.data_replaced = node, fake, True

    def guard_input_aliasing(self):
        """A graph that writes to an input computes something else when another input shares its
        memory (the write is seen through the other): guard which inputs share a storage. The fake
        inputs alias exactly as the real ones (one fake storage per real storage), so the backend
        compiles for that pattern. Frames that write no input pay nothing. Checked: every input
        when the graph writes an argument (a caller may pass a view of a module's parameter); when
        it writes only module state (BatchNorm's running statistics), the written tensors and the
        inputs that are not module state: module parameters and buffers aliasing each other by
        storage (rather than being one object) are not re-checked per call."""
        written = [version is None or version_of(fake) != version for fake, version in self._input_versions]
        tensors = [(s, t) for s, t, _ in self.inputs if isinstance(t, torch.Tensor)]  # as _input_versions
        if len(tensors) < 2 or not any(written):
            return
        state = [_is_module_state(s) for s, _ in tensors]
        all_inputs = any(w and not m for w, m in zip(written, state))
        checked = [(s, t) for (s, t), w, m in zip(tensors, written, state) if all_inputs or w or not m]
        if len(checked) > 1:
            self.guards.alias_pattern([s for s, _ in checked], [t for _, t in checked])

    def _placeholder(self, name):
        # inputs always enter the root graph (a subgraph lifts what it reads from it); placeholders
        # must precede every other node
        graph = self.root_graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        if placeholders:
            with graph.inserting_after(placeholders[-1]):
                return graph.placeholder(name)
        first = next(iter(graph.nodes), None)
        if first is None:
            return graph.placeholder(name)
        with graph.inserting_before(first):
            return graph.placeholder(name)

    @contextlib.contextmanager
    def subgraph(self, grad_enabled):
        """Record ops into a fresh fx.Graph (an autograd.Function's forward or backward) run in grad
        mode `grad_enabled`; it may read nodes of the graphs around it (see subgraphs.close)."""
        saved = self.graph, self.grad_enabled
        self.graph, self.grad_enabled = torch.fx.Graph(), grad_enabled
        try:
            yield self.graph
        finally:
            self.graph, self.grad_enabled = saved

    def subgraph_input(self, name, example):
        """A placeholder of the current subgraph standing for `example` (a fake tensor)."""
        node = self.graph.placeholder(self._unique(name))
        node.meta["example_value"] = example
        return node

    def _unique(self, base):
        # each base remembers the suffix it reached: a graph of 10,000 `mul`s names its last one in
        # one step, not after trying the 9,999 taken names (which made such graphs quadratic)
        name, i = base, self._next_suffix.get(base, 1)
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._next_suffix[base] = i
        self._names.add(name)
        return name

    # ---- ops ------------------------------------------------------------------------------------
    def call_op(self, kind, target, args, kwargs):
        """Record `target(*args, **kwargs)` (kind: call_function or call_method) and return its Variable.

        Non-tensor results (sizes, dtypes, bools from metadata) become constants and leave no node,
        unless the op mutated a tensor in place.
        """
        fake_args, fake_kwargs = to_fake((args, kwargs))
        tensors_in = [v for v in _var_leaves((args, kwargs)) if isinstance(v, TensorVariable)]
        if self.grad_enabled and any(t.data_replaced and t.fake.requires_grad for t in tensors_in):
            raise Unsupported(f"{_target_name(target)} on a tensor that requires grad and whose .data was "
                              "assigned in the frame (its gradient belongs to the tensor, not to the new data)",
                              kind="tensor_data_assignment")
        versions = [version_of(t.fake) for t in tensors_in]
        try:
            result = self._run_fake(kind, target, fake_args, fake_kwargs)
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"{_target_name(target)} failed on fake tensors: "
                              f"{self._fake_error_text(kind, target, fake_args, fake_kwargs, e)}",
                              kind="fake_tensor_failure") from e
        mutated = any(version_of(t.fake) != v for t, v in zip(tensors_in, versions)) or \
            (None in versions and _writes_by_name(target))
        leaves = pytree.tree_leaves(result)
        if self.grad_enabled and not self.grad_at_entry and \
                any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves):
            raise GradModeBreak(f"{_target_name(target)} makes a tensor that requires grad, inside a graph that "
                                "starts without grad")
        self._check_unbacked_sizes(target, fake_args, fake_kwargs, leaves)
        has_tensor = any(isinstance(x, torch.Tensor) for x in leaves)
        if not has_tensor and not mutated and not _has_symbols(leaves):
            if _fact_name(target) in TENSOR_FACTS and tensors_in:
                self.guard_tensor_fact(_fact_name(target), tensors_in)
            result = torch.Size(map(_concrete, result)) if isinstance(result, torch.Size) else \
                pytree.tree_map(_concrete, result)
            if not is_constant(result) and not (isinstance(result, (list, tuple)) and all(map(is_constant, result))):
                raise Unsupported(f"{_target_name(target)} returned {type(result).__name__}, which capture cannot hold")
            return ConstantVariable(result)
        node = self.graph.create_node(kind, target, tuple(_to_nodes(list(args))), _to_nodes(dict(kwargs)),
                                      name=self._unique(_node_name(target)))
        node.meta["example_value"] = result
        if mutated:  # (a graph that writes a tensor may not run twice: rerun.py)
            node.meta["kiln_writes_tensor"] = True
        if self._shape_env is not None and self._shape_env.pending_fresh_unbacked_symbols:
            # the numbers this op read out of tensor data: bound to its result (make_fx, tracing the
            # graph again with this ShapeEnv, must find none pending)
            self._bind_unbacked(node, result)
        node.meta["stack_trace"] = user_lines.stack_trace(self.frame)
        node.meta["source_fn_stack"] = [(node.name, target)]  # what the user called (aot copies it on)
        return self._result_variable(node, result, tensors_in)

    def _bind_unbacked(self, node, result):
        """Bind the unbacked symbols the op made to where its result holds them. A number an op reads
        internally that reaches no output (addcmul_'s `value` given as a 0-d tensor, a foreach op's
        scalar) is the op's own business: it is dropped, as it was before results held any."""
        try:
            node.meta["unbacked_bindings"] = compute_unbacked_bindings(self._shape_env, result)
        except PendingUnbackedSymbolNotFound:
            self._shape_env.pending_fresh_unbacked_symbols.clear()

    def _check_unbacked_sizes(self, target, fake_args, fake_kwargs, leaves):
        """An output size that depends on tensor data: a new unbacked symbol the op made (nonzero,
        masked_select) is refused; sizes made of numbers the graph already read out of tensor data
        (split(x, sizes.tolist())) stay symbolic, and their ops run through aten."""
        made = set()
        for x in leaves:
            if isinstance(x, torch.Tensor):
                made |= free_unbacked_symbols(x)
        if not made:
            return
        given = set()
        for a in pytree.tree_leaves((fake_args, fake_kwargs)):
            if isinstance(a, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
                given |= free_unbacked_symbols(a)
        if not made <= given:
            raise Unsupported(f"{_target_name(target)} has a data-dependent output shape", kind="data_dependent")

    def guard_tensor_fact(self, name, tensors):
        """A fact of `tensors` (TENSOR_FACTS) was read: guard it on the inputs it comes from. A tensor
        made in the frame has it from the inputs it was computed from, so all inputs met so far are
        guarded; `is_inference` of such a tensor also depends on whether inference mode is on."""
        if all(t.source is not None for t in tensors):
            sources = {t.source for t in tensors}
        else:
            sources = {s for s, _, _ in self.inputs}
            if name == "is_inference":
                mode = torch.is_inference_mode_enabled()
                self.guards.add(None, f"{self.guards.const(torch.is_inference_mode_enabled, 'INF')}() is {mode}",
                                f"torch.is_inference_mode_enabled() is {mode}")
        for source, _, node in self.inputs:
            if source in sources:  # the input's fact as capture saw it (its fake mirrors the real one)
                attr = getattr(node.meta["example_value"], name)
                read, value = (f"v.{name}()", attr()) if callable(attr) else (f"v.{name}", attr)
                self.guards.add(source, f"{read} is {value!r}" if isinstance(value, bool) else f"{read} == {value!r}",
                                f"{source!r}.{name} == {value!r}")

    def real_tensor(self, source):
        """The real input tensor reached through `source` (None if none is)."""
        for s, real, _ in self.inputs:
            if s == source:
                return real
        return None

    def _run_fake(self, kind, target, fake_args, fake_kwargs):
        for attempt in range(2):
            try:
                with self.fake_mode, torch_compat.dispatcher_for(target, fake_args, fake_kwargs), \
                        torch.set_grad_enabled(self.grad_enabled):
                    return _call_target(kind, target, fake_args, fake_kwargs)
            except _NEEDS_SHAPE_ENV:
                # The fake mode raises these only for lack of a ShapeEnv (an output whose size or
                # value depends on tensor data); with one, the op makes an unbacked symbol. Run it
                # again with the ShapeEnv, exactly as if it had been there from the start.
                if attempt or self._shape_env is not None:
                    raise
                self.ensure_shape_env()

    def _fake_error_text(self, kind, target, fake_args, fake_kwargs, e):
        """The text of an op's failure on fake tensors. Where it ran the C++ kernels eager runs (static
        sizes, see torch_compat.dispatcher_for), the text of the Python decompositions torch.compile always runs
        follows when they fail otherwise ("expand: the requested shape has too few dimensions!" for
        eager's "expand(...): the number of sizes provided ..."), so that both eager's message and
        torch.compile's are in kiln's error. The op's failure is rare: the second run costs nothing
        on a path that works."""
        text = f"{type(e).__name__}: {e}"
        if not isinstance(e, RuntimeError) or torch_compat.any_symbolic((fake_args, fake_kwargs)):
            return text  # (it ran the Python decompositions already)
        try:
            with self.fake_mode, enable_python_dispatcher(), torch.set_grad_enabled(self.grad_enabled):
                _call_target(kind, target, fake_args, fake_kwargs)
        except Exception as again:  # noqa: BLE001 (any failure: only its text is used)
            if str(again) != str(e):
                text += f" (torch.compile's Python decomposition: {type(again).__name__}: {again})"
        return text

    def _result_variable(self, node, result, tensors_in):
        if isinstance(result, torch.Tensor):
            for t in tensors_in:  # in-place ops return their input: keep its identity
                if t.fake is result:
                    return t
            if not hasattr(result, "fake_mode"):
                raise Unsupported("an op returned a real tensor during capture")
            return TensorVariable(node, result)
        if isinstance(result, (tuple, list)):
            items = []
            for i, r in enumerate(result):
                if isinstance(r, (torch.Tensor, tuple, list)) or _has_symbols([r]):
                    item = self.graph.create_node("call_function", operator.getitem, (node, i), {},
                                                  name=self._unique("getitem"))
                    item.meta["example_value"] = r
                    items.append(self._result_variable(item, r, tensors_in))
                elif is_constant(r):
                    items.append(ConstantVariable(r))
                else:
                    raise Unsupported(f"op result item of type {type(r).__name__}")
            if isinstance(result, list):
                return ListVariable(items)
            return TupleVariable(items, cls=type(result))
        if result is None:
            return ConstantVariable(None)
        if isinstance(result, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            if result.node.expr.is_number:
                return ConstantVariable(_concrete(result))
            return SymNodeVariable(node, result)
        if is_constant(result):
            return ConstantVariable(result)
        raise Unsupported(f"op returned {type(result).__name__}")

    def set_grad_enabled(self, enabled):
        """Switch grad mode inside the graph (torch.no_grad() blocks), as a node so backends see it."""
        if enabled != self.grad_enabled:
            self.graph.create_node("call_function", torch._C._set_grad_enabled, (enabled,), {},
                                   name=self._unique("set_grad_enabled"))
            self.grad_enabled = enabled

    def enter_autocast(self, mode_args):
        """Enter autocast in the graph, and for real during capture so fake tensors get its dtypes;
        returns the exit action. `leave_contexts` undoes whatever a failed capture left entered."""
        node = self.graph.create_node("call_function", torch.amp.autocast_mode._enter_autocast, tuple(mode_args), {},
                                      name=self._unique("enter_autocast"))
        mode = UnmanagedAutocast(*mode_args)
        mode.__enter__()
        self.entered.append(mode)

        def exit_autocast():
            self.graph.create_node("call_function", torch.amp.autocast_mode._exit_autocast, (node,), {},
                                   name=self._unique("exit_autocast"))
            self.entered.remove(mode)
            mode.__exit__(None, None, None)
        return exit_autocast

    def leave_contexts(self):
        while self.entered:
            self.entered.pop().__exit__(None, None, None)

    def op_count(self):
        return sum(1 for n in self.graph.nodes if n.op.startswith("call"))


# Facts of a tensor its fake mirrors but the tensor guard (GuardSet.tensor_match) does not check;
# code that reads one (`x.is_inference()`, `torch.is_conj(x)`) gets it guarded (guard_tensor_fact)
TENSOR_FACTS = {"is_inference", "is_conj", "is_neg", "_is_zerotensor", "storage_offset", "_is_view", "is_leaf"}


def _fact_name(target):
    return target if isinstance(target, str) else getattr(target, "__name__", None)


def _is_module_state(source):
    """A parameter or buffer of a module (`...._parameters['weight']`)."""
    return isinstance(source, ItemSource) and isinstance(source.base, AttrSource) and \
        source.base.name in ("_parameters", "_buffers")


def version_of(t):
    """A tensor's version counter (bumped by every write to its storage); None for an inference
    tensor, which has none."""
    return None if t.is_inference() else t._version


def _writes_by_name(target):
    """Whether an op writes to its first argument, by torch's naming (add_, __setitem__): how writes
    to inference tensors, which have no version counter, are told."""
    name = _fact_name(target) or ""
    if name.startswith("__") and name.endswith("__"):  # __setitem__, __iadd__
        return name.strip("_") in _WRITING_OPERATORS
    return name in _WRITING_OPERATORS or (name.endswith("_") and not name.startswith("_"))  # add_


_WRITING_OPERATORS = {"setitem"} | {"i" + op for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and",
                                                         "or", "xor", "lshift", "rshift", "matmul")}


def _has_symbols(leaves):
    return any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not x.node.expr.is_number
               for x in leaves)


def python_expr(og, symbolic, ctx):
    """A Python expression computing `symbolic` (a SymInt/SymFloat/SymBool) from the frame's inputs at run
    time (`L[0].size(1) * 3`), or None when it depends on a value only the graph computes (an item())."""
    from torch.utils._sympy.printers import PythonPrinter
    expr = symbolic.node.expr
    names = {}
    for sym in expr.free_symbols:
        reload = _reload_symbol(og, sym, ctx)
        if reload is None:
            return None
        names[sym] = sympy.Symbol(f"({reload})")
    text = PythonPrinter().doprint(expr.xreplace(names))
    kind = {torch.SymInt: "int", torch.SymFloat: "float", torch.SymBool: "bool"}[type(symbolic)]
    return f"{kind}({text})"


def _reload_symbol(og, sym, ctx):
    for src in og.shape_env.var_to_sources.get(sym, ()):
        if src in og.shape_source_of:  # a number input itself
            return og.shape_source_of[src].expr(ctx)
        base, idx = getattr(src, "base", None), getattr(src, "idx", None)
        if base in og.shape_source_of and idx is not None and "SIZE" in str(getattr(src, "prop", "")):
            return f"{og.shape_source_of[base].expr(ctx)}.size({idx})"
    return None


def _concrete(x):
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(x)](x)
    return x


def shape_guards(og):
    """Python guard expressions for the dynamic inputs' sizes (what the traced code assumed)."""
    if not og.dynamic_inputs:
        return []
    fakes, sources = zip(*og.dynamic_inputs)
    guards = list(og.shape_env.produce_guards(list(fakes), list(sources)))
    # sizes the code turned into Python ints (int(x.size(0)), a size returned) are pinned to that value;
    # produce_guards leaves these out, so they are added here
    for fake, source in og.dynamic_inputs:
        if isinstance(fake, torch.Tensor):
            for d in sorted(og.dynamic_input_dims[id(fake)]):
                size = fake.shape[d]
                if isinstance(size, int) or size.node.expr.is_number:
                    guards.append(f"{source.name}.size()[{d}] == {int(size)}")
    return guards


_DICT_TYPES = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter,
               types.MappingProxyType)  # (a class's __dict__: read-only, see python_builtins.dict_method)


def _stable_key(k):
    """A dict key a guard can compare by value, or by identity (classes, enum members, typing forms,
    objects without their own __eq__)."""
    if type(k) in (str, int, bytes, float, bool, type(None)) or isinstance(k, (type, enum.Enum)):
        return True
    if type(k) in (tuple, torch.Size):
        return all(_stable_key(i) for i in k)
    if type(k) is weakref.ref:  # (a WeakKeyDictionary's: equal while its referent lives, by the referent's ==)
        referent = k()
        return referent is not None and type(referent).__eq__ is object.__eq__ and _stable_key(referent)
    return type(k).__module__ == "typing" or type(k).__eq__ is object.__eq__ and not isinstance(k, torch.Tensor)


def _is_numpy_scalar(value):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.generic) and isinstance(value.item(), (int, float, bool, complex))


def _made_at_run_time(value):
    """A plain function of the user's that the program made at run time (a closure, a lambda, a nested
    def: its module does not hold it) and gave no attributes of its own."""
    return type(value) is types.FunctionType and not value.__dict__ and \
        is_user_file(value.__code__.co_filename) and not module_attribute(value)


def _is_library_object(value):
    mod = getattr(value, "__module__", None) or ""
    return mod.split(".")[0] in ("torch", "builtins", "math", "operator", "_operator")


def _var_leaves(tree):
    out = []
    _map_vars(lambda v: out.append(v), tree)
    return out


def _call_target(kind, target, args, kwargs):
    """Run a node's target as the graph will: a method of its first argument, or a function."""
    if kind == "call_method":
        return getattr(args[0], target)(*args[1:], **kwargs)
    return target(*args, **kwargs)


def to_fake(tree):
    """The fake values of Variables inside nested containers (what ops run on during capture)."""
    def conv(v):
        if isinstance(v, TensorVariable):
            return v.fake
        if isinstance(v, (ConstantVariable, SymNodeVariable)):
            return v.value
        if isinstance(v, ObjectVariable):
            if v.opaque:  # only its type is guarded: its value must not become part of the graph
                raise Unsupported(f"a {type(v.value).__qualname__} object passed to a tensor op")
            if is_scalar_type(v.value):  # torch.zeros(n, dtype=int): the fake run checks it as eager does
                return v.value
            if callable(v.value):  # fx would write its repr (`<function f at 0x..>`) into the graph's code
                raise Unsupported(f"{getattr(v.value, '__qualname__', type(v.value).__qualname__)} passed to a tensor op")
            return v.value
        raise Unsupported(f"cannot pass {v!r} to a tensor op")
    return _map_vars(conv, tree)


# Python's scalar types where torch takes a dtype (`torch.zeros(n, dtype=int)`, `x.to(float)`): torch's
# argument parser reads them as these dtypes, and only where it takes a dtype, so once the fake run has
# accepted one, the node holds the dtype (fx cannot write `<class 'int'>` into a graph's code).
PYTHON_SCALAR_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}


def is_scalar_type(value):
    return isinstance(value, type) and value in PYTHON_SCALAR_DTYPES  # (a slice is no key: unhashable)


def _to_nodes(tree):
    def conv(v):
        if isinstance(v, (TensorVariable, SymNodeVariable)):
            return v.node
        if isinstance(v, ObjectVariable) and is_scalar_type(v.value):
            return PYTHON_SCALAR_DTYPES[v.value]
        return v.value
    return _map_vars(conv, tree)


def _map_vars(fn, tree):
    """Map Variables inside nested tuples/lists/dicts (containers of Variables become real containers)."""
    if isinstance(tree, (TupleVariable,)):
        vals = [_map_vars(fn, v) for v in tree.items]
        if tree.cls in (tuple, torch.Size):  # a symbolic Size is a tuple of its size nodes to fx
            return tuple(vals)
        return tree.cls(*vals) if hasattr(tree.cls, "_fields") else tree.cls(vals)
    if isinstance(tree, ListVariable):
        return [_map_vars(fn, v) for v in tree.items]
    if isinstance(tree, DictVariable):
        return {k: _map_vars(fn, v) for k, v in tree.items.items()}
    if isinstance(tree, tuple):
        return tuple(_map_vars(fn, v) for v in tree)
    if isinstance(tree, list):
        return [_map_vars(fn, v) for v in tree]
    if isinstance(tree, dict):
        return {k: _map_vars(fn, v) for k, v in tree.items()}
    if isinstance(tree, ConstantVariable) and isinstance(tree.value, torch.Size):
        return tree.value
    if isinstance(tree, SliceVariable):
        return slice(*(_map_vars(fn, p) for p in tree.parts))
    return fn(tree)


def _target_name(target):
    if isinstance(target, str):
        return f"Tensor.{target}"
    mod = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"{mod}.{name}" if mod and mod not in ("builtins", "_operator") else name


def _node_name(target):
    name = target if isinstance(target, str) else getattr(target, "__name__", "op")
    return _sanitize(name.strip("_") or "op").lower()


def _sanitize(text):
    text = re.sub(r"_+", "_", re.sub(r"[^0-9a-zA-Z_]+", "_", text)).strip("_")
    if not text or text[0].isdigit() or text in dir(builtins):
        text = "v_" + text
    return text
