"""Smoke tests for bench/: the CLI parses, a tiny workload runs end to end, failures become rows.
No timing is asserted (timings live in bench/RESULTS.md, never in tests)."""
import json
import math
import sys

import torch

from bench import report, suite
from bench.__main__ import RESULTS_MD, main, parse_args
from bench.compilers import Compiler
from bench.harness import Settings, max_abs_diff, run_workload
from bench.results import from_json
from bench.workloads import BY_NAME, WORKLOADS, Case, Workload

TINY = Settings(budget_s=0.001, min_rounds=1, max_rounds=2, warmup_calls=1)


def test_cli_parses_every_option(tmp_path):
    args = parse_args(["--only", "softmax,mlp", "--compilers", "kiln", "--json", str(tmp_path / "a.json"),
                       "--compare", str(tmp_path / "b.json"), "--budget", "0.5", "--threads", "1",
                       "--no-cold-warm", "--results-md"])
    assert args.only == ["softmax", "mlp"] and args.compilers == ["kiln"]
    assert args.results_md == RESULTS_MD and not args.cold_warm and args.budget == 0.5


def test_workload_names_are_unique_and_cover_the_issues():
    names = [w.name for w in WORKLOADS]
    assert len(names) == len(set(names))
    assert {"overhead_add_one", "guards_mlp12", "mlp_train", "gpt2_block_train", "dynamic_gpt2_block",
            "graph_break", "hf_gpt2", "hf_bert"} <= set(names)


def test_tiny_workload_end_to_end_with_json(tmp_path, capsys):
    results_md = RESULTS_MD.read_text() if RESULTS_MD.exists() else None
    out = tmp_path / "run.json"
    argv = ["--only", "overhead_add_one", "--compilers", "eager", "--budget", "0.001", "--no-cold-warm",
            "--threads", str(torch.get_num_threads()), "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    (row,) = from_json(data)
    assert row.name == "overhead_add_one" and set(row.measurements) == {"eager"}
    assert row.measurements["eager"].calls >= BY_NAME["overhead_add_one"].min_calls
    assert "| overhead_add_one" in capsys.readouterr().out
    assert main(["--from-json", str(out), "--results-md", str(tmp_path / "again.md")]) == 0
    assert "| overhead_add_one" in (tmp_path / "again.md").read_text()
    assert "| overhead_add_one | eager |" in report.compare([row], [row], ["eager"])
    # a run with --only never overwrites the committed full table
    assert (RESULTS_MD.read_text() if RESULTS_MD.exists() else None) == results_md


def _failing(message):
    def wrap(model, workload):
        raise RuntimeError(message)
    return Compiler("kiln", "kiln", wrap, lambda: None)


def test_a_failing_compiler_is_an_error_row_and_eager_still_runs():
    result = run_workload(BY_NAME["overhead_add_one"], [_failing("no capture today")], TINY)
    assert "no capture today" in result.measurements["kiln"].error
    assert result.measurements["eager"].samples_s
    assert "no capture today" in report.markdown(_info(), [result], ["eager", "kiln"])


def test_a_workload_that_cannot_build_is_an_error_row():
    def build():
        raise ValueError("bad sizes")
    result = run_workload(Workload("broken", "raises while building", build), [], TINY)
    assert "bad sizes" in result.error
    assert "bad sizes" in report.markdown(_info(), [result], ["eager"])


def test_a_missing_module_is_a_skipped_row():
    w = Workload("needs_x", "needs a module that is not there", lambda: Case(abs, lambda m: m(1)),
                 needs=("no_such_module_kiln_bench",))
    result = run_workload(w, [], TINY)
    assert result.skipped and "no_such_module_kiln_bench" in result.skipped


def test_a_crashing_worker_costs_one_row_not_the_run(monkeypatch):
    monkeypatch.setattr(suite, "WORKER", [sys.executable, "-c", "import os; os.abort()"])
    rows = suite.run_suite([BY_NAME["softmax"], BY_NAME["mlp"]], [], TINY, threads=1, cold_warm=False,
                           compile_timeout_s=10, cold_warm_until_s=0)
    assert [r.name for r in rows] == ["softmax", "mlp"]
    assert all("SIGABRT" in r.error for r in rows)


def test_a_silent_worker_is_stopped_and_its_workload_is_an_error_row(monkeypatch):
    monkeypatch.setattr(suite, "WORKER", [sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(suite, "SILENCE_SLACK_S", 0)
    quick = Settings(first_call_limit_s=0.5)
    (row,) = suite.run_suite([BY_NAME["softmax"]], [], quick, threads=1, cold_warm=False,
                             compile_timeout_s=0.1, cold_warm_until_s=0)
    assert "no progress" in row.error


def test_training_step_measures_saved_tensors():
    result = run_workload(BY_NAME["mlp_train"], [], TINY)
    assert result.measurements["eager"].saved_mb > 0


def test_max_abs_diff():
    a = torch.tensor([1.0, float("nan"), float("inf")])
    assert max_abs_diff((a,), (a.clone(),)) == 0
    assert max_abs_diff([a], [a + 0.5]) == 0.5  # NaN and inf match where they sit in both
    assert max_abs_diff([a], [torch.tensor([1.0, 2.0, float("inf")])]) == math.inf
    assert max_abs_diff([a], [a[:2]]) == math.inf
    assert max_abs_diff([a], [a, a]) == math.inf


def _info():
    from bench.results import RunInfo
    return RunInfo(command="python -m bench", started_utc="now", wall_s=1.0,
                   machine={"cpu": "cpu", "cores": 2, "threads": 2, "python": "3", "torch": torch.__version__,
                            "kiln_commit": "x"}, settings={})
