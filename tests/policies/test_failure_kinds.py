"""Every failure the worker-group seam can report maps to one stop cause, in one place."""

from policies.causes import FAILURE_KIND_CAUSES, FailureKind, StopCause, StopObservation, classify


def test_every_failure_kind_has_a_cause():
    assert set(FAILURE_KIND_CAUSES) == set(FailureKind)


def test_failure_kinds_map_to_the_budgets_causes():
    expect = {FailureKind.ACTOR_DIED: StopCause.HOST_LOST,
              FailureKind.NODE_DIED: StopCause.HOST_LOST,
              FailureKind.ACTOR_UNAVAILABLE: StopCause.HOST_LOST,
              FailureKind.SLICE_LOST: StopCause.HOST_LOST,
              FailureKind.HUNG: StopCause.TIMEOUT,
              FailureKind.STEP_ERROR: StopCause.APPLICATION_ERROR}
    for kind, cause in expect.items():
        assert classify(StopObservation(failure=kind)).cause is cause


def test_an_oom_kill_is_a_bug_not_a_lost_host():
    out = classify(StopObservation(failure=FailureKind.ACTOR_DIED, oom=True))
    assert out.cause is StopCause.APPLICATION_ERROR


def test_an_event_explains_the_failure_that_follows_it():
    out = classify(StopObservation(event_kind="preemption_notice",
                                   failure=FailureKind.ACTOR_DIED))
    assert out.cause is StopCause.SPOT_PREEMPTION
