"""What kiln captures of each model-zoo architecture (bench/zoo.py), as a table.

    python -m bench.zoo_survey [NAME ...] [--backend eager|aot_eager|inductor] [--peer]

Per architecture, compiled once without fullgraph and run at its three lengths: graphs handed to the
backend, frames compiled (entries; recompiles are a second entry for a code object), frames left to run
eagerly, graph breaks, outputs equal to eager; then `fullgraph=True` at the three lengths: ok or the
first error. `--peer` runs torch.compile instead (its counters), for the reference column.
"""
import argparse
import collections
import sys
import traceback

import torch

from bench.zoo import ARCHS, BY_NAME, output_tensors

RTOL = ATOL = 1e-4


def _equal(actual, expected):
    a, e = output_tensors(actual), output_tensors(expected)
    return len(a) == len(e) > 0 and all(torch.allclose(x, y, rtol=RTOL, atol=ATOL) for x, y in zip(a, e))


class Counts:
    def __init__(self):
        self.graphs = 0
        self.entries = collections.Counter()   # code -> entries made
        self.eager = []                       # reasons a frame runs eagerly
        self.breaks = []                      # (msg, where) of entries that end in a break

    def backend(self, inner):
        def count(gm, example_inputs):
            self.graphs += 1
            return inner(gm, example_inputs)
        return count

    def row(self):
        recompiles = sum(n - 1 for n in self.entries.values())
        return dict(graphs=self.graphs, frames=sum(self.entries.values()), recompiles=recompiles,
                    eager=len(self.eager), breaks=len(self.breaks))


def _kiln_run(arch, backend, fullgraph, counts):
    import kiln
    from kiln.backends.registry import lookup_backend
    from kiln.capture import runtime
    kiln.reset()

    def on_entry(code, entry):
        counts.entries[code] += 1
        if entry.break_reason:
            counts.breaks.append((entry.break_reason.msg, entry.break_reason.where))
    on_eager = lambda code, reason: counts.eager.append(f"{code.co_qualname}: {reason}")  # noqa: E731
    runtime.observers.append(on_entry)
    runtime.eager_observers.append(on_eager)
    try:
        return _run(arch, kiln.compile, counts.backend(lookup_backend(backend)), fullgraph)
    finally:
        runtime.observers.remove(on_entry)
        runtime.eager_observers.remove(on_eager)


def _torch_run(arch, backend, fullgraph, counts):
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters
    dynamo.reset()
    counters.clear()
    from torch._dynamo.backends.registry import lookup_backend
    ok = _run(arch, torch.compile, counts.backend(lookup_backend(backend)), fullgraph)
    counts.entries["frames"] = counters["stats"].get("unique_graphs", 0) or counts.graphs  # one code: the model
    counts.breaks = list(counters["graph_break"].items())
    return ok


def _run(arch, compile_fn, backend, fullgraph):
    model = arch.build()
    compiled = compile_fn(model, backend=backend, fullgraph=fullgraph)
    equal = True
    with torch.no_grad():
        for length in arch.lengths:
            inputs = arch.inputs(length)
            equal &= _equal(compiled(**inputs), model(**inputs))
    return equal


def survey(name, backend, peer):
    arch = BY_NAME[name]
    run = _torch_run if peer else _kiln_run
    counts = Counts()
    try:
        correct = run(arch, backend, False, counts)
    except Exception as e:  # noqa: BLE001 - a crash is a row of the table
        correct = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    row = dict(name=name, **counts.row(), correct=correct)
    try:
        row["fullgraph"] = "ok" if run(arch, backend, True, Counts()) else "wrong"
    except Exception as e:  # noqa: BLE001
        row["fullgraph"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    row["why"] = [f"{m} @ {w}" for m, w in counts.breaks[:3]] + counts.eager[:3]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=[a.name for a in ARCHS])
    p.add_argument("--backend", default="eager")
    p.add_argument("--peer", action="store_true", help="torch.compile instead of kiln")
    args = p.parse_args(argv)
    print("| model | graphs | frames | recompiles | eager frames | breaks | correct | fullgraph=True |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.names:
        try:
            r = survey(name, args.backend, args.peer)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            continue
        print(f"| {r['name']} | {r['graphs']} | {r['frames']} | {r['recompiles']} | {r['eager']} | {r['breaks']} "
              f"| {r['correct']} | {r['fullgraph']} |", flush=True)
        for why in r["why"]:
            print(f"|   | {why[:300]} |", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
