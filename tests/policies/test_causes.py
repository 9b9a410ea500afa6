"""Stop-cause classification from plain facts."""

from __future__ import annotations

import pytest

from policies.causes import FailureKind, StopCause, StopClassifier, StopObservation, classify


@pytest.mark.parametrize(
    ("obs", "cause"),
    [
        (StopObservation(event_kind="preemption"), StopCause.SPOT_PREEMPTION),
        (StopObservation(event_kind="PREEMPTED"), StopCause.SPOT_PREEMPTION),
        (StopObservation(event_kind="maintenance"), StopCause.MAINTENANCE),
        (StopObservation(event_kind="unhealthy"), StopCause.HARDWARE_HEALTH),
        (StopObservation(event_kind="drain"), StopCause.OPERATOR),
        (StopObservation(failure=FailureKind.ACTOR_DIED), StopCause.HOST_LOST),
        (StopObservation(failure=FailureKind.NODE_DIED), StopCause.HOST_LOST),
        (StopObservation(failure=FailureKind.ACTOR_UNAVAILABLE), StopCause.HOST_LOST),
        (StopObservation(failure=FailureKind.SLICE_LOST), StopCause.HOST_LOST),
        (StopObservation(failure=FailureKind.HUNG), StopCause.TIMEOUT),
        (StopObservation(failure=FailureKind.STEP_ERROR), StopCause.APPLICATION_ERROR),
        (StopObservation(failure=FailureKind.CHECKPOINT_CORRUPT), StopCause.CHECKPOINT_CORRUPT),
        (StopObservation(), StopCause.APPLICATION_ERROR),
    ],
)
def test_classify(obs, cause):
    """Each fact maps to its documented cause."""
    assert classify(obs).cause is cause


def test_event_wins_over_the_failure_it_explains():
    """The doomed host's actor dies after its notice: still a preemption, not a lost host."""
    result = classify(StopObservation(event_kind="preemption", failure=FailureKind.ACTOR_DIED))
    assert result.cause is StopCause.SPOT_PREEMPTION
    assert "preemption" in result.reason


def test_unknown_event_kind_falls_through_to_the_failure():
    """An event kind the table does not know does not hide the failure."""
    assert classify(StopObservation(event_kind="mystery", failure=FailureKind.NODE_DIED)).cause \
        is StopCause.HOST_LOST


def test_every_failure_kind_has_a_cause():
    """The seam's closed set is classified completely (no failure falls to the default)."""
    for kind in FailureKind:
        assert classify(StopObservation(failure=kind)).reason == f"failure {kind.value}"


def test_custom_tables():
    """The classifier's event table can be replaced (e.g. a new event source)."""
    clf = StopClassifier(event_kinds=(("reclaim", StopCause.SPOT_PREEMPTION),))
    assert clf.decide(StopObservation(event_kind="reclaim")).cause is StopCause.SPOT_PREEMPTION
    assert clf.decide(StopObservation(event_kind="preemption")).cause \
        is StopCause.APPLICATION_ERROR


def test_cause_properties():
    """Announced causes can drain first; only hardware health cordons."""
    assert {c for c in StopCause if c.announced} == {
        StopCause.SPOT_PREEMPTION, StopCause.MAINTENANCE, StopCause.HARDWARE_HEALTH,
        StopCause.OPERATOR,
    }
    assert [c for c in StopCause if c.cordons_host] == [StopCause.HARDWARE_HEALTH]


def test_every_stopping_event_kind_is_classified():
    """Each EventKind the intake emits that stops the group maps to a cause (not a guess)."""
    from orchestrator.events.model import EventKind

    not_stops = {EventKind.OPERATOR_RESUME, EventKind.ALERT_FIRING, EventKind.ALERT_RESOLVED,
                 EventKind.LIVE_MIGRATION, EventKind.MAINTENANCE_CANCELLED}  # noted only
    for kind in EventKind:
        if kind in not_stops:
            continue
        assert classify(StopObservation(event_kind=kind.value)).reason == \
            f"event kind {kind.value!r}", kind


def test_chaos_fault_kinds_are_classified():
    """Each chaos fault kind, used as an event kind, maps to the cause it simulates."""
    from policies.chaos import FaultKind

    expected = {FaultKind.PREEMPT: StopCause.SPOT_PREEMPTION, FaultKind.KILL: StopCause.HOST_LOST,
                FaultKind.HANG: StopCause.TIMEOUT, FaultKind.UNHEALTHY: StopCause.HARDWARE_HEALTH}
    for kind, cause in expected.items():
        assert classify(StopObservation(event_kind=kind.value)).cause is cause
