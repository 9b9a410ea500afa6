"""The fault matrix's machinery without a cluster (CI cost: seconds): the table lists every
fault of issue 28 and every kind the fault tests inject, a dry run says what would run and what
is not implemented yet, one row runs for real (stale MEGASCALE_*, no cluster), a row that needs
a missing feature or whose harness fails says so, and leftovers are counted by the marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import fault_kit, faults
from bench.fault_kit import Background, Outcome
from bench.fault_rows import ROWS, Row
from bench.orchestrated import RunDir

ISSUE_28 = {"two-drivers", "final-save-lost", "notice-crash", "sigterm", "decision-drain-kill",
            "hang-init", "disk-full", "driver-sigkill", "stale-megascale", "hang-step"}
FAULT_TEST_KINDS = {"preempt-spare", "preempt-no-spare", "kill-9", "kill-in-save",
                    "hang-step", "hang-init", "corrupt-newest", "driver-sigkill", "shrink-grow"}


def _json(out: Path) -> dict:
    (path,) = out.glob("faults-*.json")
    return json.loads(path.read_text())


def test_the_matrix_has_every_fault_once():
    names = [r.name for r in ROWS]
    assert len(names) == len(set(names))
    assert set(names) >= ISSUE_28 | FAULT_TEST_KINDS


def test_a_dry_run_lists_every_row_and_runs_nothing(tmp_path, capsys):
    assert faults.main(["--dry-run", "--out", str(tmp_path), "--workdir",
                        str(tmp_path / "w")]) == 0
    rows = {r["fault"]: r for r in _json(tmp_path)["rows"]}
    assert set(rows) == {r.name for r in ROWS}
    for row in ROWS:
        want = ("not implemented" if row.unavailable() else "skipped" if row.skipped()
                else "dry run")
        assert rows[row.name]["status"] == want, row.name
    assert not [r for r in rows.values() if r["status"] == "not implemented"], (
        "every fault of the matrix is injected")
    assert rows["disk-full"]["status"] == "dry run" or rows["disk-full"]["outcome"].startswith(
        "skipped: needs ")
    header = "| fault | status | outcome | lost steps | to first step (s) |"
    assert header in capsys.readouterr().out
    assert list((tmp_path / "w").iterdir()) == [], "a dry run starts no run"


def test_one_row_runs_for_real(tmp_path, capsys):
    assert faults.main(["--only", "stale-megascale", "--out", str(tmp_path), "--workdir",
                        str(tmp_path / "w")]) == 0
    (row,) = _json(tmp_path)["rows"]
    assert (row["fault"], row["status"]) == ("stale-megascale", "ok")
    assert row["load_before"] is not None
    assert "| stale-megascale | ok | no host of the 1-slice mesh" in capsys.readouterr().out


def test_a_missing_feature_or_a_failing_harness_is_said_not_faked(tmp_path):
    def broken(d: Path, timeout_s: float) -> Outcome:
        raise RuntimeError("no cluster here")

    missing = Row("x", "a fault", "a reaction", broken, requires="orchestrator.no_such_module")
    assert faults.run_row(missing, tmp_path, timeout_s=1, dry_run=False)["outcome"] == (
        "not implemented yet: orchestrator.no_such_module is not in this tree")
    failing = faults.run_row(Row("y", "a fault", "a reaction", broken, cluster=False),
                             tmp_path, timeout_s=1, dry_run=False)
    assert failing["status"] == "UNEXPECTED"
    assert failing["outcome"] == "bench error: RuntimeError: no cluster here"


def test_a_row_this_machine_cannot_inject_is_skipped_saying_what_it_needs(tmp_path):
    def never(d: Path, timeout_s: float) -> Outcome:
        raise AssertionError("a skipped row must not run")

    row = Row("z", "a fault", "a reaction", never, needs=lambda: "needs a mount namespace")
    res = faults.run_row(row, tmp_path, timeout_s=1, dry_run=False)
    assert (res["status"], res["outcome"]) == ("skipped", "skipped: needs a mount namespace")


def test_the_disk_filler_stops_at_a_full_disk():
    from bench import fault_disk

    assert fault_disk.fill(Path("/dev/full")) == 0, "ENOSPC at once: nothing written, no error"


def test_leftovers_are_found_by_the_run_marker_and_killed(tmp_path):
    env = {**os.environ, fault_kit.MARK: "smoke-marker"}
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    bg = Background(proc=stray, run_dir=tmp_path, marker="smoke-marker")
    try:
        (left,) = bg.leftovers(0.5)
        assert "time.sleep(600)" in left
        assert stray.wait(10) != 0, "counted, then killed"
    finally:
        stray.kill()


def test_what_a_run_dir_says_about_a_recovery(tmp_path):
    rd = RunDir(path=tmp_path, timeline=[
        {"prev": None, "state": "PLANNING", "at": 1.0},
        {"prev": "X", "state": "RUNNING", "slices": ["a", "b"]},
        {"prev": "X", "state": "RUNNING", "slices": ["a", "b"]},
        {"prev": "RUNNING", "state": "RELEASING", "reason": "r"},
        {"prev": "X", "state": "RUNNING", "slices": ["a"]},
        {"prev": None, "state": "PLANNING", "at": 18.0},  # a second driver
        {"prev": "X", "state": "RUNNING", "slices": ["a", "c"]}],
        metrics=[{"step": 1, "wall_time": 10.0}, {"step": 2, "wall_time": 17.0},
                 {"step": 2, "wall_time": 20.0}])
    assert fault_kit.running_slices(rd) == [2, 1, 2]
    assert fault_kit.transition(rd, "RUNNING", "RELEASING")["reason"] == "r"
    assert [len(part) for part in fault_kit.drivers(rd)] == [5, 2]
    assert fault_kit.first_record_after(rd, 15.0) == 17.0
    assert fault_kit.resumed_first_step(rd, 16.0) == 4.0, "the second driver's first record"
    assert fault_kit.first_record_after(rd, 25.0) is None
