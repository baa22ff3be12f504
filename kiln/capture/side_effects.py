"""Mutations of Python state made by the captured code, replayed after the graph runs.

Containers that existed before the frame (ListVariable/DictVariable with a Source) are marked
`mutated` and rewritten wholesale from their final symbolic contents; attribute, global and
closure-cell stores are kept here, and later reads during capture see them.
"""


class SideEffects:
    def __init__(self):
        self.attr_stores = {}    # (id(obj), name) -> (obj Variable, name, value Variable or DELETED)
        self.global_stores = {}  # (id(globals dict), name) -> (GlobalSource, value Variable)
        self.cell_stores = {}    # id(cell) -> (CellSource, value Variable)
        self.mutated = []        # existing containers changed in place (ListVariable/DictVariable)
        self._data_stores = 0    # `t.data = v` stores so far (each keyed apart)
        # id(existing object) -> the DictVariable of its __dict__, once the frame read `obj.__dict__`:
        # from then on it holds the object's attributes (objects.instance_dict)
        self.instance_dicts = {}

    DELETED = object()

    def store_attr(self, obj_var, name, value):
        """`obj_var.name = value`; keyed by the object (a tensor's by its fake)."""
        target = obj_var.fake if hasattr(obj_var, "fake") else obj_var.value
        self.attr_stores[(id(target), name)] = (obj_var, name, value)

    def store_tensor_data(self, tensor_var, value):
        """`tensor_var.data = value`: each one kept in program order (a later one does not replace
        an earlier one, whose value a tensor in between may have taken)."""
        self._data_stores += 1
        self.attr_stores[("data", self._data_stores), "data"] = (tensor_var, "data", value)

    def rekey_attrs(self, old, new):
        """The Python attributes stored on the object keyed `old` (a tensor's fake) now key `new`."""
        for key in [k for k in self.attr_stores if k[0] == id(old)]:
            self.attr_stores[(id(new), key[1])] = self.attr_stores.pop(key)

    def forget_attr(self, obj, name):
        self.attr_stores.pop((id(obj), name), None)

    def pop_attr_stores(self, obj):
        """The (name, value or DELETED) stores made so far on `obj`, in the order first made; they
        are no longer kept here."""
        keys = [k for k in self.attr_stores if k[0] == id(obj)]
        return [self.attr_stores.pop(k)[1:] for k in keys]

    def load_attr(self, obj, name):
        entry = self.attr_stores.get((id(obj), name))
        return None if entry is None else entry[2]

    def store_global(self, source, value):
        # keyed by the dict, not the source: the frame's own globals and a callee's view of the same
        # module's globals (G['x'] vs GD['x']) are one variable
        self.global_stores[(source.namespace, source.name)] = (source, value)

    def load_global(self, source):
        entry = self.global_stores.get((source.namespace, source.name))
        return None if entry is None else entry[1]

    def load_module_global(self, gdict, name):
        """A global of `gdict` the frame has stored (also read as `module.name`), or None."""
        entry = self.global_stores.get((id(gdict), name))
        return None if entry is None else entry[1]

    def store_cell(self, cell, source, value):
        self.cell_stores[id(cell)] = (source, value)

    def load_cell(self, cell):
        entry = self.cell_stores.get(id(cell))
        return None if entry is None else entry[1]

    def mark_mutated(self, container):
        if container.source is not None and not container.mutated:
            container.mutated = True
            self.mutated.append(container)

    def count(self):
        """How many stores are recorded: a call that changes it had Python side effects."""
        return len(self.attr_stores), len(self.global_stores), len(self.cell_stores), len(self.mutated)

    def __bool__(self):
        return bool(self.attr_stores or self.global_stores or self.cell_stores or self.mutated)
