"""Deterministic fault schedule keyed by (host, step), each fault firing once."""

from __future__ import annotations

import pytest

from policies.chaos import Fault, FaultKind, FaultSchedule

SCHEDULE = FaultSchedule(faults=(
    Fault(at_step=10, host=1, kind=FaultKind.KILL),
    Fault(at_step=5, host=0, kind=FaultKind.PREEMPT, deadline_s=3.0),
    Fault(at_step=5, host=1, kind=FaultKind.UNHEALTHY),
))


def test_due_returns_faults_in_step_order():
    """Nothing before step 5; at 5 both step-5 faults, sorted by (step, host)."""
    assert SCHEDULE.due(4) == []
    assert [f.key for f in SCHEDULE.due(5)] == [(5, 0, "preempt"), (5, 1, "unhealthy")]


def test_fired_faults_do_not_fire_again():
    """After a fall-back restore the run passes step 10 again; the kill does not repeat."""
    fired = {f.key for f in SCHEDULE.due(10)}
    assert len(fired) == 3
    assert SCHEDULE.due(10, fired=fired) == []
    assert SCHEDULE.due(12, fired=fired) == []


def test_skipped_steps_are_caught_up():
    """If the driver sees step 7 after step 4, the step-5 faults are still due."""
    assert len(SCHEDULE.due(7)) == 2


def test_schedule_is_deterministic():
    """The same schedule gives the same answer every time (no randomness)."""
    assert SCHEDULE.due(10) == SCHEDULE.due(10)
    assert SCHEDULE.last_step == 10
    assert FaultSchedule().last_step is None


def test_invalid_fault():
    """Negative steps or hosts are refused."""
    with pytest.raises(ValueError):
        Fault(at_step=-1, host=0, kind=FaultKind.KILL)
