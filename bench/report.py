"""Markdown tables from a run's results: speed, compile time, per-call overhead, training memory, dynamic
shapes, errors; and the change against an earlier --json file."""
import math

from bench.compilers import COMPILERS

NOTES = """\
How to read it:

- Every time is the median per call after warm-up. Eager and compiled calls are interleaved (eager, kiln,
  torch.compile, eager, ..., the starting compiler rotating each round), so load from other processes hits
  each alike. *noise* = half the interquartile range of a row's samples over their median (worst compiler).
- *speedup* = eager time / compiled time. *kiln vs torch* = torch.compile time / kiln time (above 1: kiln
  is faster).
- *max diff* = the largest absolute difference from eager over every output (and every gradient, for
  training steps); *ok* when within the workload's tolerance (1e-3, relative to the output's magnitude).
- *first call* = capture + compile + one run in this process (compile caches start empty for the run;
  Python, torch and each compiler are already warmed up on a trivial function). *cold* = the first call in a
  fresh process with empty kiln and torch.compile caches (`KILN_CACHE_DIR`, `TORCHINDUCTOR_CACHE_DIR`,
  `TRITON_CACHE_DIR` in a new folder); *warm* = the same in another fresh process with the caches the cold
  one left.
- kiln and torch.compile get the same `backend` and `dynamic` arguments and their defaults otherwise
  (torch.compile: default mode, Inductor), the same seeded inputs and the same thread count, so the
  torch.compile numbers can be reproduced with the same command and torch version."""


def markdown(info, results, compilers, old=None):
    names = [c for c in compilers if c != "eager"]
    sections = {
        "Speed": _speed(results, names),
        "Compile time": _compile(results, names),
        "Per-call overhead (tiny calls: what the compiled wrapper itself costs)": _overhead(results, names),
        "Training memory (saved for backward in one step, parameters excluded)": _memory(results, names),
        "Dynamic shapes (one call = one pass over every sequence length)": _dynamic(results, names),
        "Errors and skipped workloads": _problems(results),
        "Change against the earlier run": compare(old, results, compilers) if old is not None else "",
    }
    body = [f"## {title}\n\n{table}" for title, table in sections.items() if table]
    return "\n\n".join(["# kiln benchmark results", _header(info), NOTES, *body]) + "\n"


def _header(info):
    m = info.machine
    loads = [x for x in (m.get("load_average"), m.get("load_average_end")) if x]
    load = f"; load average (1/5/15 min) at start {loads[0]}, at end {loads[-1]}" if loads else ""
    text = (f"Command: `{info.command}` (run {info.started_utc} UTC, {info.wall_s / 60:.1f} min in all)\n\n"
            f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} torch/OpenMP threads{load}; "
            f"Python {m['python']}, torch {m['torch']}, kiln commit {m['kiln_commit']}.")
    busiest = max((x[0] for x in loads), default=0)
    if busiest > 0.5 * m["cores"]:
        text += (f"\n\n**This run shared the machine with other work** (1-minute load average up to {busiest} on "
                 f"{m['cores']} cores): absolute times are inflated and noisy; ratios between compilers, taken "
                 "from interleaved samples, are the steadier numbers.")
    return text


def _table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) if rows else ""  # an empty table: the section is left out


def _label(name):
    return COMPILERS[name].label


def _ran(results, kinds):
    return [r for r in results if r.kind in kinds and not r.skipped and not r.error]


def _speed(results, names):
    head = ["workload", "eager"] + [_label(n) for n in names]
    head += [f"{_label(n)} speedup" for n in names]
    if {"kiln", "torch"} <= set(names):
        head.append("kiln vs torch")
    head += [f"{_label(n)} max diff" for n in names] + ["noise"]
    rows = []
    for r in _ran(results, ("inference", "training", "dynamic")):
        row = [f"{r.name}<br><sub>{r.description}</sub>", _cell_time(r, "eager")]
        row += [_cell_time(r, n) for n in names]
        row += [_ratio(r.speedup(n)) for n in names]
        if {"kiln", "torch"} <= set(names):
            row.append(_ratio(_divide(r.median("torch"), r.median("kiln"))))
        row += [_check(r.measurements.get(n)) for n in names]
        row.append(_noise(r))
        rows.append(row)
    return "\n\n".join(t for t in (_table(head, rows), _geomean(results, names)) if t)


def _geomean(results, names):
    """One line: each compiler's geometric-mean speedup over the rows where every compiler ran."""
    rows = [r for r in _ran(results, ("inference", "training", "dynamic"))
            if all(r.speedup(n) for n in names)]
    if not rows or not names:
        return ""
    means = [f"{_label(n)} {math.exp(sum(math.log(r.speedup(n)) for r in rows) / len(rows)):.2f}x"
             for n in names]
    return f"Geometric-mean speedup over eager, on the {len(rows)} rows where every compiler ran: " + \
        ", ".join(means) + "."


def _compile(results, names):
    if not names:
        return ""
    head = ["workload"]
    for n in names:
        head += [f"{_label(n)} first call", f"{_label(n)} cold", f"{_label(n)} warm"]
    rows = []
    for r in _ran(results, ("inference", "training", "dynamic")):
        row = [r.name]
        for n in names:
            m = r.measurements.get(n)
            row += [_seconds(m and m.first_call_s), _seconds(m and m.cold_s), _seconds(m and m.warm_s)]
        rows.append(row)
    return _table(head, rows)


def _overhead(results, names):
    head = ["workload", "eager µs/call"] + [f"{_label(n)} µs/call" for n in names]
    head += [f"{_label(n)} − eager µs" for n in names] + ["calls timed each"]
    rows = []
    for r in _ran(results, ("overhead",)):
        eager = r.median("eager")
        row = [f"{r.name}<br><sub>{r.description}</sub>", _micro(eager)]
        row += [_micro(r.median(n)) for n in names]
        row += [_micro(_minus(r.median(n), eager), signed=True) for n in names]
        row.append(f"{min((m.calls for m in r.measurements.values() if not m.error), default=0):,}")
        rows.append(row)
    return _table(head, rows)


def _memory(results, names):
    head = ["workload", "eager MB"] + [f"{_label(n)} MB" for n in names] + [f"{_label(n)} / eager" for n in names]
    rows = []
    for r in _ran(results, ("training",)):
        mb = {n: (r.measurements[n].saved_mb if n in r.measurements else None) for n in ["eager", *names]}
        row = [r.name] + [_number(mb[n], "{:.1f}") for n in ["eager", *names]]
        row += [_ratio(_divide(mb[n], mb["eager"])) for n in names]
        rows.append(row)
    return _table(head, rows)


def _dynamic(results, names):
    head = ["workload", "eager pass"] + [f"{_label(n)} first pass (with compiles)" for n in names]
    head += [f"{_label(n)} later pass" for n in names]
    rows = []
    for r in _ran(results, ("dynamic",)):
        row = [r.name, _cell_time(r, "eager")]
        row += [_seconds(r.measurements[n].first_call_s) if n in r.measurements else "—" for n in names]
        row += [_cell_time(r, n) for n in names]
        rows.append(row)
    return "\n\n".join(t for t in (_table(head, rows), _static_vs_dynamic(results, names)) if t)


def _static_vs_dynamic(results, names):
    """Steady-state speed of kernels compiled with dynamic=True against the same call compiled static.
    Compared through each row's speedup over its own (interleaved) eager, since the two rows ran at
    different times and the machine's load may have changed in between."""
    by_name = {r.name: r for r in results}
    rows = []
    for r in results:
        twin = by_name.get(r.static_twin) if r.static_twin else None
        if twin is None:
            continue
        for n in names:
            static, dynamic = twin.speedup(n), r.speedup(n)
            rows.append([f"{r.name} vs {twin.name}", _label(n), _ratio(static), _ratio(dynamic),
                         _ratio(_divide(dynamic, static))])
    return _table(["same call", "compiler", "static: speedup over eager", "dynamic=True: speedup over eager",
                   "dynamic / static"], rows)


def _problems(results):
    lines = []
    for r in results:
        if r.skipped:
            lines.append(f"- **{r.name}** skipped: {r.skipped}")
        elif r.error:
            lines.append(f"- **{r.name}** failed: `{r.error}`")
        for m in r.measurements.values():
            if m.error:
                lines.append(f"- **{r.name}** / {_label(m.compiler)}: `{m.error}`")
            if m.passed is False:
                lines.append(f"- **{r.name}** / {_label(m.compiler)}: result differs from eager "
                             f"(max abs diff {m.max_abs_diff:.3g})")
            if m.cold_warm_error:
                lines.append(f"- **{r.name}** / {_label(m.compiler)} cold/warm compile: `{m.cold_warm_error}`")
    return "\n".join(lines) or "None."


def compare(old, new, compilers):
    """Old and new median per workload and compiler, the change (negative: faster now), and the speedup over
    eager before and now (steadier than raw times on a loaded machine: both sides share the load)."""
    before = {r.name: r for r in old}
    rows = []
    for r in new:
        was = before.get(r.name)
        for n in compilers:
            then, now = (was.median(n) if was else None), r.median(n)
            if then is None and now is None:
                continue
            change = f"{(now / then - 1) * 100:+.1f}%" if then and now else "—"
            speedups = ["", ""] if n == "eager" else [_ratio(was.speedup(n) if was else None), _ratio(r.speedup(n))]
            rows.append([r.name, _label(n), _time(then), _time(now), change, *speedups])
    return _table(["workload", "compiler", "before", "now", "change", "speedup before", "speedup now"], rows)


# ---------------------------------------------------------------- cells

def _cell_time(result, name):
    m = result.measurements.get(name)
    if m is None:
        return "—"
    if m.error:
        return "error"
    return _time(m.median_s)


def _noise(result):
    """The worst interquartile range over median among the compilers: above ~10%, read the row with care."""
    spreads = [m.spread for m in result.measurements.values() if m.spread is not None and not m.error]
    return f"±{max(spreads) * 50:.0f}%" if spreads else "—"


def _check(m):
    if m is None:
        return "—"
    if m.max_abs_diff is None:
        return "error" if m.error else "—"
    return f"{'ok' if m.passed else '**FAIL**'} {m.max_abs_diff:.1e}"


def _time(seconds):
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _seconds(seconds):
    return "—" if seconds is None else f"{seconds:.2f} s"


def _micro(seconds, signed=False):
    if seconds is None:
        return "—"
    return f"{seconds * 1e6:+.2f}" if signed else f"{seconds * 1e6:.2f}"


def _ratio(x):
    return "—" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def _number(x, fmt):
    return "—" if x is None else fmt.format(x)


def _divide(a, b):
    return a / b if a is not None and b else None


def _minus(a, b):
    return a - b if a is not None and b is not None else None
