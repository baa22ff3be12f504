"""Random programs over mutable Python state, called again and again with that state changed between
calls: each compiled call must equal eager's, in its result and in the state it leaves. This is the
tester of guards and side effects, where test_fuzz_programs is the tester of the compiler: a stale
answer here is a fact the compiled code assumed and no guard checked.

A program is a function `f(x)` over a module's globals (ints, floats, bools, strings, lists, dicts,
tuples, None, a tensor, an object, an nn.Module, a helper function, a closure cell), built from
fragments that read that state (branches, loops, lookups, attribute tests), some that write it (side
effects) and some that break the graph. Its schedule changes the state between calls: values,
types, container contents, attributes added and deleted, rebinding, module mode and parameters, the
input's shape, dtype and layout, the grad mode. The program runs twice, in two namespaces made from
the same source: one eagerly, one through `kiln.compile`, each schedule step applied to both.

    python -m tests.capture.test_fuzz_state SEED [dynamic]    # print one program, its schedule, and check it
    python -m tests.compiler.fuzz_driver --check tests.capture.test_fuzz_state:check_seeds \\
        --shapes mixed --seed0 0 --n 2000 --batch 50           # a long run
"""
import dataclasses
import random
import sys

import pytest
import torch

import kiln

PRELUDE = '''
import torch

G_INT = 3
G_FLOAT = 0.5
G_BOOL = True
G_STR = "a"
G_LIST = [1, 2]
G_DICT = {"k": 1}
G_TUPLE = (1, 2)
G_NONE = None
G_T = torch.ones(3)


class Obj:
    k = 1

    def __init__(self):
        self.a = 2
        self.b = 1.5


OBJ = Obj()


class Mod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 3)
        self.scale = 2.0
        self.flag = True

    def forward(self, x):
        x = self.lin(x) * self.scale
        if self.flag:
            x = x + 1
        if self.training:
            x = x * 2
        return x


MOD = Mod()


def HELPER(x):
    return x * 2


def HELPER_B(x):
    return x - 1


def _make():
    cell = 1

    def f(x):
        global G_INT, G_FLOAT, G_BOOL, G_STR, G_LIST, G_DICT, G_TUPLE, G_NONE, G_T, OBJ, MOD, HELPER
        nonlocal cell
{body}
        return x

    def set_cell(value):
        nonlocal cell
        cell = value
    return f, set_cell


f, SET_CELL = _make()
'''

# Fragments: lines of f's body (indented by PRELUDE) over the tensor `x` of shape (n, 3).
READS = [
    "x = x + G_INT",
    "x = x * G_FLOAT",
    "if G_BOOL:\n    x = x + 1",
    "x = x + (1 if G_STR == 'a' else 2)",
    "x = x + len(G_STR)",
    "x = x * len(G_LIST)",
    "x = x + sum(G_LIST)",
    "for v in G_LIST:\n    x = x + v",
    "x = x + G_DICT.get('k', 0)",
    "if 'k' in G_DICT:\n    x = x - G_DICT['k']",
    "x = x + len(G_DICT)",
    "for key, v in G_DICT.items():\n    x = x + v * len(key)",
    "x = x + G_TUPLE[0] * G_TUPLE[-1]",
    "x = x + OBJ.a",
    "if hasattr(OBJ, 'c'):\n    x = x + OBJ.c",
    "x = x * getattr(OBJ, 'b', 1.0)",
    "x = x + type(OBJ).k",
    "x = MOD(x)",
    "x = x + G_T",
    "x = x + cell",
    "if G_NONE is not None:\n    x = x + G_NONE",
    "x = x + x.shape[0]",
    "if x.dtype == torch.float64:\n    x = x * 3",
    "if isinstance(G_INT, float):\n    x = x / 2",
    "x = HELPER(x)",
    "if x.requires_grad:\n    x = x * 5",
    "if torch.is_grad_enabled():\n    x = x + 0.25",
    "if x.is_contiguous():\n    x = x + 0.5",
    "x = x + G_LIST[-1]",
    "x = x * G_DICT['k']",
    "x = x + getattr(OBJ, G_STR, 0)",
    "x = x + torch.tensor(G_LIST, dtype=x.dtype).sum()",
    "x = x + torch.full((G_INT % 3 + 1, 1), 1.0, dtype=x.dtype).sum()",
    "for i in range(G_INT % 4):\n    x = x + i",
    "x = x.sum(dim=G_INT % 2, keepdim=True) + x",
    "x = x[G_INT % x.shape[0]:] * 1.5",
    "x = x + len([v for v in G_LIST if v > 1])",
    "x = x + MOD.lin.weight.sum()",
    "x = x.to(G_T.dtype)",
    "x = x + sum(v for v in G_DICT.values())",
    "if G_T.sum() > 3:\n    x = x + 2",
    "x = x + len(vars(OBJ))",
    "x = x + (lambda y: y * G_INT)(x)",
    "x = x + float(G_STR == 'b')",
]
WRITES = [
    "G_LIST.append(len(G_LIST))",
    "OBJ.a = OBJ.a + 1",
    "G_DICT['n'] = G_DICT.get('n', 0) + 1",
    "G_INT = G_INT + 1",
    "MOD.scale = MOD.scale * 1.5",
    "cell = cell + 1",
    "OBJ.c = x.shape[0]",
    "G_T = G_T + 1",
    "G_T.add_(1)",
    "G_LIST.sort(reverse=True)",
    "G_DICT.setdefault('s', len(G_DICT))",
    "del G_LIST[0]",
    "G_DICT.pop('k')",
    "OBJ.b = x.sum().item() > 0",
    "MOD.flag = not MOD.flag",
    "G_STR = G_STR + 'b'",
]
BREAKS = [
    "if x.sum() > 0:\n    x = x + 1\nelse:\n    x = x - 1",
    "x = x + x.sum().item()",
    "print(end='')",
]

# Changes between calls: name -> values drawn for it (applied by `change`).
CHANGES = {
    "int": [0, 1, 3, 4, -2], "int_to_float": [0.5, 3.0], "float": [0.5, 0.25, 2.0], "bool": [None],
    "str": ["a", "b", "ab"], "list_append": [0, 5], "list_pop": [None], "list_set": [7, 1],
    "list_rebind": [(), (3,), (1, 2)], "dict_set": [1, 4], "dict_del": [None], "dict_add": [2],
    "dict_rebind": [None], "tuple": [(1, 2), (2, 3), (0,)], "none": [None, 1.5], "obj_a": [2, 5],
    "obj_c": [3], "obj_del_c": [None], "obj_rebind": [None], "obj_del_b": [None], "class_k": [1, 4],
    "mod_scale": [2.0, 0.5], "mod_flag": [None], "mod_mode": [None], "mod_weight": [0.1],
    "mod_lin": [1, 2], "tensor_inplace": [1.0], "tensor_rebind": [2.0], "tensor_double": [None],
    "cell": [1, 3], "helper": [None], "shape": [2, 4, 5], "dtype": [None], "layout": [None],
    "no_grad": [None], "requires_grad": [None],
}


@dataclasses.dataclass
class Program:
    seed: int
    body: list            # fragments
    schedule: list        # per call: [(change, value)]

    def source(self):
        lines = "\n".join(line for fragment in self.body for line in fragment.split("\n"))
        return PRELUDE.replace("{body}", "\n".join("        " + line for line in lines.split("\n")))


def program(seed):
    rng = random.Random(seed)
    body = [rng.choice(READS) for _ in range(rng.randint(2, 7))]
    for pool, chance in ((WRITES, 0.6), (BREAKS, 0.3), (WRITES, 0.3)):
        if rng.random() < chance:
            body.insert(rng.randint(0, len(body)), rng.choice(pool))
    kinds = sorted(CHANGES)
    schedule = [[]] + [[(kind, rng.choice(CHANGES[kind])) for kind in rng.sample(kinds, rng.randint(0, 3))]
                       for _ in range(rng.randint(3, 9))]
    return Program(seed, body, schedule)


@dataclasses.dataclass
class Call:
    """What one call is made with besides the namespace's state."""
    n: int = 3
    dtype: torch.dtype = torch.float32
    transposed: bool = False
    no_grad: bool = False
    requires_grad: bool = False

    def input(self, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(3, self.n, generator=g, dtype=self.dtype).t() if self.transposed else \
            torch.randn(self.n, 3, generator=g, dtype=self.dtype)
        return x.requires_grad_(self.requires_grad)


def change(ns, call, kind, value):
    """Apply one schedule step to namespace `ns` (and the call settings)."""
    obj = ns["OBJ"]
    if kind == "int":
        ns["G_INT"] = value
    elif kind == "int_to_float":
        ns["G_INT"] = value
    elif kind == "float":
        ns["G_FLOAT"] = value
    elif kind == "bool":
        ns["G_BOOL"] = not ns["G_BOOL"]
    elif kind == "str":
        ns["G_STR"] = value
    elif kind == "list_append":
        ns["G_LIST"].append(value)
    elif kind == "list_pop":
        if ns["G_LIST"]:
            ns["G_LIST"].pop()
    elif kind == "list_set":
        if ns["G_LIST"]:
            ns["G_LIST"][0] = value
    elif kind == "list_rebind":
        ns["G_LIST"] = list(value)
    elif kind == "dict_set":
        ns["G_DICT"]["k"] = value
    elif kind == "dict_del":
        ns["G_DICT"].pop("k", None)
    elif kind == "dict_add":
        ns["G_DICT"]["zz"] = value
    elif kind == "dict_rebind":
        ns["G_DICT"] = {"zz": 3, "k": 2}
    elif kind == "tuple":
        ns["G_TUPLE"] = value
    elif kind == "none":
        ns["G_NONE"] = value
    elif kind == "obj_a":
        obj.a = value
    elif kind == "obj_c":
        obj.c = value
    elif kind == "obj_del_c":
        if hasattr(obj, "c"):
            del obj.c
    elif kind == "obj_del_b":
        if "b" in vars(obj):
            del obj.b
    elif kind == "obj_rebind":
        ns["OBJ"] = ns["Obj"]()
    elif kind == "class_k":
        ns["Obj"].k = value
    elif kind == "mod_scale":
        ns["MOD"].scale = value
    elif kind == "mod_flag":
        ns["MOD"].flag = not ns["MOD"].flag
    elif kind == "mod_mode":
        ns["MOD"].train(not ns["MOD"].training)
    elif kind == "mod_weight":
        with torch.no_grad():
            ns["MOD"].lin.weight.add_(value)
    elif kind == "mod_lin":
        torch.manual_seed(value)
        ns["MOD"].lin = torch.nn.Linear(3, 3)
    elif kind == "tensor_inplace":
        ns["G_T"].add_(value)
    elif kind == "tensor_rebind":
        ns["G_T"] = torch.full((3,), value)
    elif kind == "tensor_double":
        ns["G_T"] = ns["G_T"].double() if ns["G_T"].dtype == torch.float32 else ns["G_T"].float()
    elif kind == "cell":
        ns["SET_CELL"](value)
    elif kind == "helper":
        ns["HELPER"] = ns["HELPER_B"] if ns["HELPER"] is not ns["HELPER_B"] else ns["_helper_a"]
    elif kind == "shape":
        call.n = value
    elif kind == "dtype":
        call.dtype = torch.float64 if call.dtype == torch.float32 else torch.float32
    elif kind == "layout":
        call.transposed = not call.transposed
    elif kind == "no_grad":
        call.no_grad = not call.no_grad
    elif kind == "requires_grad":
        call.requires_grad = not call.requires_grad
    else:
        raise ValueError(kind)


def namespace(p):
    ns = {"__name__": f"fuzz_state_{p.seed}"}
    exec(compile(p.source(), f"<fuzz_state {p.seed}>", "exec"), ns)
    ns["_helper_a"] = ns["HELPER"]
    return ns


def state(ns):
    """What a call may have changed, in comparable form."""
    mod = ns["MOD"]
    return {
        **{name: ns[name] for name in ("G_INT", "G_FLOAT", "G_BOOL", "G_STR", "G_TUPLE")},
        "G_LIST": list(ns["G_LIST"]), "G_DICT": dict(ns["G_DICT"]), "G_NONE": ns["G_NONE"],
        "G_T": ns["G_T"].detach().clone(), "OBJ": dict(vars(ns["OBJ"])), "Obj.k": ns["Obj"].k,
        "MOD": (mod.scale, mod.flag, mod.training, [p.detach().clone() for p in mod.parameters()]),
        "HELPER": ns["HELPER"].__name__,
    }


def run(fn, ns, call, seed):
    """(result, error type) of one call."""
    x = call.input(seed)
    try:
        with torch.set_grad_enabled(not call.no_grad):
            return fn(x), None
    except Exception as e:  # noqa: BLE001 -- eager's error is the answer the compiled call must give
        return None, type(e)


def check(p, shapes="static", compile_fn=None):
    """Raise AssertionError naming the first call where compiled and eager differ. `compile_fn`:
    what compiles f (kiln.compile with the eager backend: guards and side effects are capture's)."""
    eager_ns, compiled_ns = namespace(p), namespace(p)
    dynamic = {"static": False, "dynamic": True, "automatic": None}[shapes]
    compiled = (compile_fn or (lambda fn: kiln.compile(fn, backend="eager", dynamic=dynamic)))(compiled_ns["f"])
    eager_call, compiled_call = Call(), Call()
    for i, step in enumerate(p.schedule):
        for kind, value in step:
            change(eager_ns, eager_call, kind, value)
            change(compiled_ns, compiled_call, kind, value)
        expected, expected_error = run(eager_ns["f"], eager_ns, eager_call, p.seed + i)
        got, error = run(compiled, compiled_ns, compiled_call, p.seed + i)
        where = f"call {i} after {step}"
        assert error == expected_error, f"{where}: compiled raised {error}, eager {expected_error}"
        if expected_error is not None:
            # a graph that raises runs its frame again eagerly, so eager's writes before the failing
            # op are made, except where the graph wrote a tensor itself (kiln/capture/rerun.py); the
            # schedule ends there (the states part when they differ)
            if not any("_(" in fragment for fragment in p.body):
                _assert_same_state(state(compiled_ns), state(eager_ns), where)
            return
        torch.testing.assert_close(got, expected, msg=lambda m: f"{where}: {m}")
        assert got.requires_grad == expected.requires_grad, f"{where}: requires_grad differs"
        _assert_same_state(state(compiled_ns), state(eager_ns), where)


def _assert_same_state(got, expected, where):
    for name, value in expected.items():
        if not _same(got[name], value):
            raise AssertionError(f"{where}: state {name} is {got[name]!r}, eager's {value!r}")


def _same(a, b):
    if isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.allclose(a, b, equal_nan=True)
    if isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(b, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in b)
    return type(a) is type(b) and a == b


def check_seeds(seeds, shapes):
    """fuzz_driver's check: [(seed, message)] for the programs of `seeds` that fail."""
    failures = []
    for seed in seeds:
        kind = shapes if shapes in ("static", "dynamic", "automatic") else ("static", "dynamic", "automatic")[seed % 3]
        try:
            check(program(seed), kind)
        except AssertionError as e:
            failures.append((seed, str(e)))
        except Exception as e:  # noqa: BLE001 -- kiln's own error on a program eager runs
            failures.append((seed, f"{type(e).__name__}: {e}"))
    return failures


SEEDS = range(0, 120)
BATCH = 40


@pytest.mark.parametrize("shapes", ["static", "automatic"])
@pytest.mark.parametrize("first", range(SEEDS.start, SEEDS.stop, BATCH), ids=lambda s: f"seeds{s}")
def test_programs_over_changing_state_match_eager(first, shapes):
    failures = check_seeds(range(first, first + BATCH), shapes)
    assert not failures, "\n\n".join(f"seed {s} ({shapes}): {msg}" for s, msg in failures[:3])


def test_the_tester_sees_a_stale_answer():
    """A compiler that answers every call with its first result is caught at the first change."""
    def stale(fn):
        first = []
        return lambda x: (first or [first.append(fn(x))]) and first[0]
    p = Program(0, ["x = x + G_INT"], [[], [("int", 4)]])
    check(p, compile_fn=lambda fn: fn)
    with pytest.raises(AssertionError, match="call 1"):
        check(p, compile_fn=stale)


if __name__ == "__main__":
    prog = program(int(sys.argv[1]))
    print(prog.source())
    print("schedule:", prog.schedule)
    check(prog, sys.argv[2] if len(sys.argv) > 2 else "static")
    print("ok")
