"""Badput in ``ml-goodput-measurement``'s buckets (issue 32 item 5): every cause of ours lands in
one of the library's own ``BadputType`` buckets, a restore splits by whether training had
started, and the bucket seconds add up to our badput."""

from __future__ import annotations

import pytest

from orchestrator.metrics.goodput import CAUSES, compute_goodput
from orchestrator.metrics.ml_goodput import BUCKETS, NOT_MEASURED, bucket_of, ml_badput
from orchestrator.metrics.records import StepRecord


def _step(step: int, inc: int, at: float, *, seconds: float = 1.0) -> StepRecord:
    return StepRecord.build(step=step, loss=1.0, step_time_s=seconds, tokens=8, flops=1.0,
                            grad_norm=1.0, wall_time=at, devices=1, peak=(1.0, "configured"),
                            incarnation=inc, slices=1)


def test_bucket_names_are_the_librarys_badput_types():
    from ml_goodput_measurement.src.goodput_utils import BadputType

    for name in (*BUCKETS, *NOT_MEASURED):
        assert BadputType[name.upper()].name.lower() == name


@pytest.mark.parametrize("cause", CAUSES)
def test_every_cause_lands_in_one_bucket(cause):
    for before in (True, False):
        assert bucket_of(cause, before_first_step=before) in BUCKETS


def test_a_run_with_a_restart_fills_the_buckets_and_they_sum_to_badput():
    """Start (FORMING 4 s, fresh RESTORING 2 s, COMPILING 3 s), 4 steps, a node lost: 2 steps
    re-done after the restore, re-form 5 s, restore 1.5 s, compile 1 s, final save 0.5 s."""
    timeline = [
        {"state": "PLANNING", "at": 0.0, "incarnation": 0},
        {"state": "FORMING", "at": 0.0, "incarnation": 1},
        {"state": "RESTORING", "at": 4.0, "incarnation": 1},
        {"state": "COMPILING", "at": 6.0, "incarnation": 1},
        {"state": "RUNNING", "at": 9.0, "incarnation": 1, "step": 0},
        {"state": "PLANNING", "at": 13.0, "incarnation": 1},
        {"state": "FORMING", "at": 14.0, "incarnation": 2},
        {"state": "RESTORING", "at": 18.0, "incarnation": 2},
        {"state": "COMPILING", "at": 19.5, "incarnation": 2},
        {"state": "RUNNING", "at": 20.5, "incarnation": 2, "step": 2},
        {"state": "CHECKPOINTING", "at": 24.5, "incarnation": 2},
        {"state": "SUCCEEDED", "at": 25.0, "incarnation": 2},
    ]
    steps = [_step(s, 1, 9.0 + s) for s in range(1, 5)]
    steps += [_step(s, 2, 20.5 + s - 2) for s in range(3, 7)]
    g = compute_goodput(timeline, steps, now=30.0)
    b = g.ml_badput_s
    assert b["tpu_initialization"] == pytest.approx(4.0)
    assert b["training_prep"] == pytest.approx(2.0)
    assert b["program_startup"] == pytest.approx(3.0 + 1.0)
    assert b["unproductive_checkpoint_restore_time"] == pytest.approx(1.5)
    assert b["unproductive_checkpoint_save_time"] == pytest.approx(0.5)
    assert b["wasted_progress_from_disruption"] == pytest.approx(2.0), "steps 3 and 4 re-done"
    assert b["infrastructure_recovery_from_disruption"] == pytest.approx(1.0 + 4.0)
    assert sum(b.values()) == pytest.approx(sum(g.badput_s.values()))
    assert g.productive_s + sum(b.values()) == pytest.approx(g.wall_s)
    assert set(g.to_dict()["ml_goodput_badput_s"]) == set(BUCKETS)


def test_no_intervals_no_badput():
    assert ml_badput([]) == dict.fromkeys(BUCKETS, 0.0)
