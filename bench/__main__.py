"""`python -m bench`: kiln vs eager vs torch.compile, side by side; prints a markdown table.

The environment (thread count, empty compile caches in a temporary folder) is set before torch is
imported, so that eager, kiln and torch.compile all run under the same settings.
"""
import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

from bench.machine import REPO, cache_environment, thread_environment

RESULTS_MD = REPO / "bench" / "RESULTS.md"
DEFAULT_COMPILERS = ("kiln", "torch")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", type=_names, metavar="NAME[,NAME]", help="comma-separated workload names (see --list)")
    p.add_argument("--compilers", type=_names, default=list(DEFAULT_COMPILERS), metavar="kiln,torch",
                   help="comma-separated: kiln, torch (eager always runs: it is the reference)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write every measurement as JSON")
    p.add_argument("--compare", type=Path, metavar="OLD.json", help="show the change against an earlier --json")
    p.add_argument("--results-md", type=Path, metavar="FILE", nargs="?", const=RESULTS_MD,
                   help=f"write the markdown here (default without --only: {RESULTS_MD.relative_to(REPO)})")
    p.add_argument("--budget", type=float, default=1.0, metavar="SECONDS",
                   help="timed seconds per compiler per workload (default 1.0)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch and OpenMP threads (default: all cores)")
    p.add_argument("--no-cold-warm", dest="cold_warm", action="store_false",
                   help="skip the cold/warm compile subprocesses")
    p.add_argument("--compile-timeout", type=float, default=300, metavar="SECONDS",
                   help="limit for one cold/warm compile subprocess (default 300)")
    p.add_argument("--max-minutes", type=float, default=28, metavar="MINUTES",
                   help="time plan for the run: past 80%% of it, cold/warm compiles are left out (default 28)")
    p.add_argument("--cache-dir", type=Path, metavar="DIR",
                   help="keep this run's compile caches (and generated code) here instead of a temporary folder")
    p.add_argument("--from-json", type=Path, metavar="FILE",
                   help="run nothing: print (and with --results-md write) the report of an earlier --json run")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    return p.parse_args(argv)


def _names(text):
    return [n.strip() for n in text.split(",") if n.strip()]


def main(argv=None):
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    # patch.dict puts the environment back afterwards (main() also runs inside the test process)
    with _cache_root(args.cache_dir) as cache_root, \
            mock.patch.dict(os.environ, {**cache_environment(cache_root), **thread_environment(args.threads)}):
        return run(args, command)


def _cache_root(kept):
    """The folder that holds this run's compile caches: a fresh temporary one unless --cache-dir names one."""
    if kept is None:
        return tempfile.TemporaryDirectory(prefix="kiln-bench-cache-")
    kept.mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(str(kept.resolve()))


def run(args, command):
    from bench import machine, report, results as results_mod
    from bench.compilers import COMPILERS
    from bench.harness import Settings
    from bench.suite import run_suite
    from bench.workloads import BY_NAME, WORKLOADS

    if args.list:
        for w in WORKLOADS:
            print(f"{w.name:22} {w.kind:10} {w.description}")
        return 0
    unknown = [n for n in (args.only or []) if n not in BY_NAME]
    unknown += [c for c in args.compilers if c not in COMPILERS]
    if unknown:
        sys.exit(f"unknown workload or compiler: {', '.join(unknown)}; workloads: {', '.join(BY_NAME)}; "
                 f"compilers: {', '.join(c for c in COMPILERS if c != 'eager')}")
    # read the old results first: a bad --compare file should fail now, not after a long run
    old = results_mod.from_json(json.loads(args.compare.read_text())) if args.compare else None
    if args.from_json:
        return _render_saved(args, old)
    compilers = [COMPILERS[c] for c in args.compilers if c != "eager"]
    workloads = [BY_NAME[n] for n in args.only] if args.only else WORKLOADS

    started, clock = datetime.now(timezone.utc), time.perf_counter()
    about = machine.describe(args.threads)
    results = run_suite(workloads, compilers, Settings(budget_s=args.budget), threads=args.threads,
                        cold_warm=args.cold_warm, compile_timeout_s=args.compile_timeout,
                        cold_warm_until_s=args.max_minutes * 60 * 0.8)
    about["load_average_end"] = machine.load_average()
    info = results_mod.RunInfo(command=command, started_utc=started.strftime("%Y-%m-%d %H:%M"),
                               wall_s=time.perf_counter() - clock, machine=about,
                               settings={"budget_s": args.budget, "cold_warm": args.cold_warm,
                                         "compilers": [c.name for c in compilers]})
    _write(args, info, results, report.markdown(info, results, ["eager", *(c.name for c in compilers)], old=old))
    return 0


def _render_saved(args, old):
    """The report of a saved run, exactly as that run would have written it (its own command and machine)."""
    from bench import report
    from bench.results import RunInfo, from_json

    data = json.loads(args.from_json.read_text())
    info, results = RunInfo(**data["info"]), from_json(data)
    text = report.markdown(info, results, ["eager", *info.settings["compilers"]], old=old)
    print(text)
    if args.results_md:
        args.results_md.write_text(text)
    return 0


def _write(args, info, results, text):
    from bench.results import to_json

    print(text)
    if args.json:
        args.json.write_text(json.dumps(to_json(info, results), indent=1))
    destination = args.results_md or (None if args.only else RESULTS_MD)
    if destination:
        destination.write_text(text)
        print(f"wrote {destination}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
