"""Every re-form is a recovery in the summary (issue 53 item 10): a grow back (with its phases
and timing, and a drain reason that says it is planned, with no deadline), a driver that resumes
a run dir an earlier one left (the restored step and the steps re-done), and the steps whose
records no driver wrote, named with why."""

from __future__ import annotations

import itertools
import json

import pytest

from orchestrator.controller.summary import RunSummary
from tests.controller.harness import lose_slice_then_add_one, make


def _grow(tmp_path, commit_after: int):
    sim = make(tmp_path, "cluster.emulate.slices=2", "run.total_steps=60",
               "controller.elastic.min_resize_interval_s=0", slices=("s0", "s1"),
               commit_after=commit_after)
    lose_slice_then_add_one(sim)
    return sim, sim.run()


def test_a_grow_back_is_a_recovery_with_its_phases_and_timing(tmp_path):
    sim, summary = _grow(tmp_path, commit_after=0)
    assert summary.state == "SUCCEEDED"
    grow = summary.recoveries[-1]
    assert (grow["kind"], grow["cause"]) == ("grow", "capacity_returned")
    assert grow["reason"].startswith("grow 1 -> 2 slices")
    assert grow["restored_step"] == summary.restores[-1]["restored_step"]
    assert grow["lost_steps"] == 0 and grow["to_first_step_s"] > 0
    assert {"DRAINING", "RELEASING", "FORMING", "RESTORING", "COMPILING"} <= set(grow["phases_s"])
    written = json.loads((sim.run_dir / "summary.json").read_text())["recoveries"][-1]
    assert written["kind"] == "grow" and written["first_step_at"] == grow["first_step_at"]
    assert "recovery (grow, capacity_returned): grow 1 -> 2 slices" in summary.as_text("r")


@pytest.mark.parametrize("commit_after", [0, 3])  # 0: step committed, 3: the grow saves it
def test_a_grow_drain_says_it_is_planned_with_no_deadline(tmp_path, commit_after):
    sim, _ = _grow(tmp_path, commit_after=commit_after)
    tl = sim.controller.lifecycle.timeline
    after = [nxt for t, nxt in itertools.pairwise(tl)
             if t.state.value == "DRAINING" and t.reason.startswith("grow")]
    assert after, [t.reason for t in tl]
    for t in after:
        assert "a planned grow, no deadline" in t.reason and "s left" not in t.reason, t.reason
    saves = [p for p in sim.payloads("CHECKPOINTING") if p.purpose == "grow"]
    assert bool(saves) == (commit_after > 0)  # the timeline says why it saves


def test_a_drain_without_a_deadline_never_logs_a_placeholder_as_time_left(tmp_path):
    """The drain's own decision (the log's drain_decision and event_action) says there is no
    deadline, not "3600.0s left", the hour the policy is asked with."""
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        _grow(tmp_path, commit_after=3)
    said = [e["reason"] for e in logs
            if e.get("event") in ("drain_decision", "event_action") and "reason" in e
            and str(e.get("action", "drain:")).startswith("drain:")]
    assert said, [e.get("event") for e in logs][:20]
    assert all("s left" not in r and r.startswith("no deadline") for r in said), said


def _metrics(run_dir, steps) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in steps)


def _earlier_driver(run_dir, *, state: str, step: int) -> None:
    """The timeline an earlier driver left: it started, formed and ended its lines in
    ``state`` at ``step`` (killed there when ``state`` is a working state)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"seq": 0, "state": "PLANNING", "prev": None, "at": 10.0, "step": 0},
             {"seq": 1, "state": "FORMING", "prev": "PLANNING", "at": 11.0, "step": 0},
             {"seq": 2, "state": state, "prev": "FORMING", "at": 20.0, "step": step}]
    (run_dir / "timeline.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_driver_killed_and_rerun_records_the_resume_as_a_recovery(tmp_path):
    """The earlier driver died RUNNING with records up to step 17 and step 15 committed: the
    rerun's summary has a driver_restart recovery from step 15 that re-did 2 steps (a run dir's
    first driver has none)."""
    (tmp_path / "first").mkdir()
    assert make(tmp_path / "first").run().recoveries == []
    run_dir = tmp_path / "run"
    _earlier_driver(run_dir, state="RUNNING", step=17)
    _metrics(run_dir, range(1, 18))
    sim = make(tmp_path)
    sim.fleet.disk.committed.append(15)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    (rec,) = summary.recoveries
    assert (rec["kind"], rec["cause"], rec["restored_step"]) == ("driver_restart",
                                                                  "driver_died", 15)
    assert rec["lost_steps"] == 2 == summary.lost_steps
    assert rec["previous_driver"] == {"state": "RUNNING", "step": 17, "at": 20.0,
                                      "ended": False}
    assert {"FORMING", "RESTORING", "COMPILING"} <= set(rec["phases_s"])
    assert rec["to_first_step_s"] > 0
    assert "the earlier driver died in RUNNING at step 17; restored step 15" in \
        summary.as_text("r")


def test_a_rerun_after_a_stop_is_a_driver_restart_that_ended(tmp_path):
    run_dir = tmp_path / "run"
    _earlier_driver(run_dir, state="STOPPED", step=15)
    _metrics(run_dir, range(1, 16))
    sim = make(tmp_path)
    sim.fleet.disk.committed.append(15)
    (rec,) = sim.run().recoveries
    assert (rec["cause"], rec["lost_steps"], rec["previous_driver"]["ended"]) == (
        "driver_ended", 0, True)


def test_a_resume_names_the_unrecorded_steps_and_why(tmp_path):
    """Step 15 committed, records only to 10 (the driver died, the hosts trained on): the
    resume's recovery names the gap with its reason, as the printed summary does."""
    sim = make(tmp_path)
    sim.fleet.disk.committed.append(15)
    _metrics(sim.run_dir, range(1, 11))
    summary = sim.run()
    (rec,) = summary.recoveries
    assert (rec["kind"], rec["cause"]) == ("driver_restart", "checkpoint_found")
    assert rec["metrics_gap"]["steps"] == [11, 15] == summary.metrics_gaps[0]
    assert "cannot be recovered" in rec["metrics_gap"]["why"]
    assert "cannot be recovered" in summary.as_text("r")


def test_the_printed_recovery_names_a_grow_and_its_restored_step():
    s = RunSummary(state="SUCCEEDED", reason="done", step=60, total_steps=60, lost_steps=0,
                   restarts={}, phases_s={}, wall_s=1.0, first_loss=None, last_loss=None,
                   median_step_s=None, compile_s=[], compiles=[], restores=[], recoveries=[
                       {"kind": "grow", "cause": "capacity_returned",
                        "reason": "grow 1 -> 2 slices at step 25", "restored_step": 25,
                        "to_first_step_s": 2.5, "phases_s": {"FORMING": 1.0}}])
    assert ("  recovery (grow, capacity_returned): grow 1 -> 2 slices at step 25; restored "
            "step 25, to first step 2.5s, lost 0") in s.as_text("r")
