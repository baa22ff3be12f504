"""The long-run driver of the random-program tester: a crash or a hang in one program costs that
program only, and every outcome is named by seed (tests/compiler/fuzz_driver.py)."""
import os
import signal
import time

from tests.compiler import fuzz_driver


def check_with_a_crash_and_a_hang(seeds, shapes):
    """A stand-in for fuzz_driver.check_seeds: seed 2 is a wrong answer, seed 4 a SIGSEGV, seed 5
    never finishes."""
    if 4 in seeds:
        os.kill(os.getpid(), signal.SIGSEGV)
    if 5 in seeds:
        time.sleep(600)
    return [(2, f"wrong answer ({shapes})")] if 2 in seeds else []


def test_a_crash_or_a_hang_costs_only_its_own_program(tmp_path):
    said = []
    result = fuzz_driver.run(0, 7, 3, "static", timeout=3, log=str(tmp_path / "log.jsonl"), say=said.append,
                             check_name="tests.compiler.test_fuzz_driver:check_with_a_crash_and_a_hang")
    assert result["passed"] == 4  # 0, 1, 3 and 6: 3 and 6 after the crash and the hang
    assert result["failed"] == [(2, "wrong answer (static)")]
    assert [s for s, _ in result["crashed"]] == [4] and "signal 11" in result["crashed"][0][1]
    assert [s for s, _ in result["hung"]] == [5]
    assert "summary" in (tmp_path / "log.jsonl").read_text().splitlines()[-1]
    assert "1 failed, 1 crashed, 1 hung" in fuzz_driver.summary(result)
