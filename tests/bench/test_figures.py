"""Figure arithmetic on synthetic run outputs (no processes): what each figure is made of."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import figures, machine, table
from bench.config import BenchConfig, preset
from bench.orchestrated import RunDir
from bench.schedule import lost_steps, summarize
from bench.stats import ratio, spread
from orchestrator.shared.errors import ConfigError


def _recs(steps, *, t0=100.0, dt=1.0, inc=1, st=0.5):
    return [{"step": s, "wall_time": t0 + i * dt, "step_time_s": st, "incarnation": inc}
            for i, s in enumerate(steps)]


def test_spread_reports_median_quartiles_and_range():
    """Median, quartiles, min, max and count of the values."""
    assert spread([3.0, 1.0, 2.0]) == {"n": 3, "median": 2.0, "p25": 1.5, "p75": 2.5,
                                       "min": 1.0, "max": 3.0}
    assert spread([])["median"] is None


def test_ratio_is_none_without_a_positive_denominator():
    """A missing side gives no ratio rather than a division error."""
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None and ratio(1.0, 4.0) == 0.25


def test_lost_steps_counts_redone_steps():
    """Reached step 7, resumed at step 6 (from checkpoint 5): steps 6 and 7 are done twice."""
    recs = _recs([5, 6, 7, 6, 7, 8])
    assert lost_steps(recs) == 2
    assert lost_steps(_recs([1, 2, 3])) == 0
    restored = {"step": 5, "wall_time": 1e9, "restored": True}
    assert lost_steps([*_recs([5, 6, 7]), restored]) == 2


def test_schedule_summary_counts_only_the_last_run_of_each_useful_step():
    """Steps 1-3 at 0.5 s, step 3 redone at 2.0 s after a restore, then step 4 at 0.5 s:
    goodput = 4 useful steps x median 0.5 s / 10 s; time in useful steps = (0.5 x 3 + 2.0) / 10."""
    recs = [*_recs([1, 2, 3]), *_recs([3], t0=104.0, st=2.0), *_recs([4], t0=105.0)]
    out = summarize(recs, t0=100.0, seconds=10.0, skip=0)
    assert out["useful_steps"] == 4 and out["steps_lost"] == 1
    assert out["goodput"] == pytest.approx(0.2)
    assert out["useful_step_time_share"] == pytest.approx(0.35)


def test_overhead_compares_steady_medians():
    """Ratio of orchestrated to bare median step time after the warm-up steps."""
    orch = [_recs(range(1, 11), st=0.6)]
    bare = [{"records": [{"step": s, "wall_time": 100.0 + s, "step_time_s": 0.5,
                          "save_in_flight": False, "save_blocking_s": 0.0}
                         for s in range(1, 11)]}]
    fig = figures.overhead(orch, bare, skip=2)
    assert fig["ratio_step_time"] == pytest.approx(1.2)
    assert fig["ratio_wall_per_step"] == pytest.approx(1.0)


def test_checkpoint_inflation_splits_steps_by_save_state():
    """Save-issuing steps count with their blocking part; in-flight steps count as during."""
    recs = [{"step": 1, "step_time_s": 1.0, "save_in_flight": False, "save_blocking_s": 0.0},
            {"step": 2, "step_time_s": 1.0, "save_in_flight": False, "save_blocking_s": 1.0},
            {"step": 3, "step_time_s": 2.0, "save_in_flight": True, "save_blocking_s": 0.0},
            {"step": 4, "step_time_s": 1.0, "save_in_flight": False, "save_blocking_s": 0.0}]
    fig = figures.checkpoint_inflation([{"records": recs}], skip=0)
    assert fig["ratio"] == 2.0
    assert fig["during_save_step_s"]["n"] == 2 and fig["without_save_step_s"]["n"] == 2


def test_announced_recovery_reads_notice_commit_and_first_new_step(tmp_path: Path):
    """Notice → committed from the timeline, → first step from the next incarnation's records."""
    run = RunDir(path=tmp_path, summary={"state": "SUCCEEDED", "step": 12, "recoveries": [
        {"kind": "announced", "started_at": 108.0, "step": 8, "saved_step": 8,
         "lost_steps": 0, "phases_s": {"DRAINING": 0.1, "FORMING": 5.0}}]},
        metrics=_recs(range(1, 9)) + _recs(range(9, 13), t0=130.0, inc=2),
        timeline=[{"state": "RELEASING", "prev": "CHECKPOINTING", "at": 110.5}])
    fig = figures.announced_recovery(run)
    assert fig["notice_to_committed_s"] == pytest.approx(2.5)
    assert fig["notice_to_first_step_s"] == pytest.approx(22.0)
    assert fig["steps_lost"] == 0 and fig["steps_lost_from_records"] == 0


def test_full_restart_counts_steps_since_the_last_checkpoint(tmp_path: Path):
    """Killed at step 9, resumed after checkpoint 8: one step lost."""
    first = RunDir(path=tmp_path, metrics=_recs(range(1, 10)))
    second = RunDir(path=tmp_path, summary={"state": "SUCCEEDED", "step": 12},
                    metrics=_recs(range(1, 10)) + _recs(range(9, 13), t0=200.0))
    fig = figures.full_restart({"killed_at": 108.5, "stop_s": 3.0}, first, second)
    assert fig["steps_lost"] == 1 and fig["notice_to_first_step_s"] == pytest.approx(91.5)


def test_the_kill_moment_is_when_the_job_left_running(tmp_path: Path):
    """The injected kill's time comes from the timeline, not from polling the metrics."""
    killed = RunDir(path=tmp_path, summary={"state": "FAILED", "exit_code": 1}, timeline=[
        {"state": "RUNNING", "prev": "COMPILING", "at": 100.0},
        {"state": "RECOVERING", "prev": "RUNNING", "at": 104.2},
        {"state": "FAILED", "prev": "RECOVERING", "at": 104.3}])
    assert figures.kill_moment(killed, exited_at=106.2) == pytest.approx(
        {"killed_at": 104.2, "stop_s": 2.0, "exit_code": 1})
    finished = RunDir(path=tmp_path, summary={"state": "SUCCEEDED"}, timeline=[
        {"state": "CHECKPOINTING", "prev": "RUNNING", "at": 104.2}])
    assert figures.kill_moment(finished, exited_at=106.0) is None


def test_bad_settings_name_the_setting():
    """A preemption before the first checkpoint is rejected with the setting's name."""
    with pytest.raises(ConfigError, match=r"bench\.preempt_at_step"):
        BenchConfig(preempt_at_step=5, checkpoint_every=10)
    with pytest.raises(ConfigError, match=r"bench\.nope"):
        preset("quick", nope=1)


def test_between_steps_share_is_the_gap_not_spent_stepping():
    """Steps of 0.5 s ending 1 s apart: half the wall time is outside steps."""
    assert figures.between_steps_share(_recs(range(1, 6), st=0.5)) == pytest.approx(0.5)
    saving = [{**r, "save_blocking_s": 0.3} for r in _recs(range(1, 3))]
    assert figures.between_steps_share(saving) is None


def test_a_figure_taken_on_a_busy_machine_is_marked_not_a_result():
    idle = [{"measurement": "bare_once[0]", "before": [0.4, 1.0, 1.2], "after": [2.1, 1.3, 1.2]},
            {"measurement": "restart_once[0]", "before": [1.2, 1.1, 1.2], "after": None}]
    v = machine.validity(idle)
    assert (v["valid"], v["max_load_1min_before"], v["busy"]) == (True, 1.2, [])
    busy = machine.validity([*idle, {"measurement": "goodput_figure", "before": [3.5, 2, 1],
                                     "after": [3, 2, 1]}])
    assert not busy["valid"]
    assert busy["busy"] == ["goodput_figure started at 1-minute load 3.50"]
    assert not machine.validity([])["valid"], "no load recorded is no proof of idleness"
    assert "NOT A RESULT" in table._validity_line(busy)
    assert "goodput_figure started at 1-minute load 3.50" in table._validity_line(busy)
    assert table._validity_line(v).startswith("validity: idle machine")


def test_tiers_ab_split_leaves_out_warmup_and_each_blocks_first_step():
    """ram-ab: on-blocks 1..10, 21..30; off-blocks 11..20, 31..40; the first step of every block
    (the previous block's last copy is still in flight) and the warm-up are left out."""
    from bench.tiers import ab_costs
    from bench.tiers import figures as tier_figures

    recs = [{"step": s, "step_time_s": 1.0 if ((s - 1) // 10) % 2 == 0 else 0.5,
             "ram_copy_s": 0.1 if ((s - 1) // 10) % 2 == 0 else 0.0, "incarnation": 1}
            for s in range(1, 41)]
    recs.append({"step": 50, "step_time_s": 9.0, "incarnation": 2})  # a later incarnation
    got = ab_costs(recs, skip=5, block=10)
    assert len(got["on"]) == 5 + 9 and len(got["off"]) == 9 + 9
    assert set(got["on"]) == {1.1} and set(got["off"]) == {0.5}
    runs = [{"repeat": 0, "system": "ram-ab", "on_s": 1.1, "off_s": 1.0}]
    assert tier_figures(runs)["ram_on_vs_off_in_one_run"]["median"] == pytest.approx(1.1)
