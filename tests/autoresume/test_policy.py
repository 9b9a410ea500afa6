"""Unit tests of the pure autoresume decision (policies/autoresume.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.autoresume import (
    Action,
    AutoresumeRules,
    Heartbeat,
    Incident,
    IncidentKind,
    IncidentState,
    JobStatus,
    Observation,
    RunHistory,
    Submission,
    backoff_s,
    decide,
    next_submission_id,
    restart_number,
)

NOW = 1_000_000.0
RULES = AutoresumeRules(
    max_restarts=3, window_s=3600.0, backoff_base_s=10.0, backoff_max_s=60.0,
    startup_grace_s=120.0, stall_after_s=300.0,
)


def incident(**kw) -> Incident:
    base = dict(incident_id="inc-1", run_id="run-a", state=IncidentState.OPEN,
                kind=IncidentKind.HEARTBEAT_ABSENT, started_at=NOW - 60)
    base.update(kw)
    return Incident(**base)


def obs(*subs: Submission, inc: Incident | None = None, hist: RunHistory | None = None,
        hb: Heartbeat | None = None, now: float = NOW) -> Observation:
    return Observation(incident=inc or incident(), submissions=subs,
                       history=hist or RunHistory(), heartbeat=hb, now=now)


def sub(sid: str, status: JobStatus, start: float = NOW - 3600) -> Submission:
    return Submission(submission_id=sid, status=status, start_time=start)


def test_dead_job_is_resubmitted_with_next_id():
    """A FAILED first submission gets restart 1 under <run>-r1, immediately."""
    d = decide(obs(sub("run-a-r0", JobStatus.FAILED)), RULES)
    assert (d.action, d.submission_id, d.delay_s) == (Action.RESUBMIT, "run-a-r1", 0.0)
    assert d.acts_now


def test_no_submission_at_all_is_resubmitted():
    """A cluster that lost every job (restart) still gets the run back."""
    d = decide(obs(), RULES)
    assert (d.action, d.submission_id) == (Action.RESUBMIT, "run-a-r1")


def test_failed_run_resubmits():
    """FAILED means the run died."""
    assert decide(obs(sub("run-a-r2", JobStatus.FAILED)), RULES).action is Action.RESUBMIT


def test_deliberately_stopped_run_is_not_resubmitted():
    """`ray job stop` by someone else is a do-not-resume marker: NOTHING, reason says so."""
    d = decide(obs(sub("run-a-r2", JobStatus.STOPPED)), RULES)
    assert d.action is Action.NOTHING and "stopped deliberately" in d.reason


def test_run_stopped_by_autoresume_itself_is_resubmitted():
    """A stalled submission autoresume stopped (resubmit failed) still gets its resubmission."""
    hist = RunHistory(stopped=("run-a-r2",))
    d = decide(obs(sub("run-a-r2", JobStatus.STOPPED), hist=hist), RULES)
    assert (d.action, d.submission_id) == (Action.RESUBMIT, "run-a-r3")


def test_run_on_hold_is_left_alone():
    """An operator's do-not-resume marker wins over a dead job."""
    d = decide(replace(obs(sub("run-a-r0", JobStatus.FAILED)), hold="DO_NOT_RESUME: upgrade"),
               RULES)
    assert d.action is Action.NOTHING and "upgrade" in d.reason


def test_succeeded_run_is_left_alone():
    """A finished run is never restarted."""
    d = decide(obs(sub("run-a-r0", JobStatus.SUCCEEDED)), RULES)
    assert d.action is Action.NOTHING and "succeeded" in d.reason


def test_duplicate_incident_does_nothing():
    """The same incident id after we acted on it is a duplicate."""
    hist = RunHistory(handled_incidents=frozenset({"inc-1"}))
    d = decide(obs(sub("run-a-r0", JobStatus.FAILED), hist=hist), RULES)
    assert d.action is Action.NOTHING and "duplicate" in d.reason


def test_closed_incident_does_nothing_even_if_open_arrives_later():
    """Reordering: closed seen first, then the stale open notification of the same incident."""
    hist = RunHistory(closed_incidents=frozenset({"inc-1"}))
    d = decide(obs(sub("run-a-r0", JobStatus.FAILED), hist=hist), RULES)
    assert d.action is Action.NOTHING and "closed" in d.reason
    d2 = decide(obs(sub("run-a-r0", JobStatus.FAILED), inc=incident(state=IncidentState.CLOSED)),
                RULES)
    assert d2.action is Action.NOTHING


def test_live_healthy_job_is_not_touched():
    """RUNNING with a fresh heartbeat: the alert is stale or spurious."""
    d = decide(obs(sub("run-a-r0", JobStatus.RUNNING), hb=Heartbeat(step=40, at=NOW - 10)), RULES)
    assert d.action is Action.NOTHING and "step 40" in d.reason


def test_live_stalled_job_is_stopped_and_resubmitted():
    """RUNNING with a heartbeat older than stall_after_s: stop it, then resubmit."""
    d = decide(obs(sub("run-a-r1", JobStatus.RUNNING), hb=Heartbeat(step=40, at=NOW - 1000)),
               RULES)
    assert (d.action, d.stop_submission_id, d.submission_id) == (
        Action.STOP_AND_RESUBMIT, "run-a-r1", "run-a-r2")


def test_pending_submission_blocks_a_second_one():
    """A PENDING submission is live: never submit another."""
    d = decide(obs(sub("run-a-r1", JobStatus.PENDING)), RULES)
    assert d.action is Action.NOTHING and "pending" in d.reason


def test_incident_older_than_live_submission_is_ignored():
    """Reordering: an incident that started before the current submission concerns a dead one."""
    inc = incident(started_at=NOW - 900)
    d = decide(obs(sub("run-a-r1", JobStatus.RUNNING, start=NOW - 600), inc=inc), RULES)
    assert d.action is Action.NOTHING and "predates" in d.reason


def test_young_submission_is_in_grace_period():
    """A job that started seconds ago has not had time to heartbeat."""
    inc = incident(started_at=NOW - 5)
    d = decide(obs(sub("run-a-r1", JobStatus.RUNNING, start=NOW - 30), inc=inc), RULES)
    assert d.action is Action.NOTHING and "starting" in d.reason


def test_two_live_submissions_refuse_to_act():
    """If something else already doubled the run, autoresume does not make it worse."""
    d = decide(obs(sub("run-a-r1", JobStatus.RUNNING), sub("run-a-r2", JobStatus.RUNNING)), RULES)
    assert d.action is Action.NOTHING and "2 live" in d.reason


def test_budget_spent_gives_up():
    """max_restarts within the window -> GIVE_UP, and NOTHING forever after."""
    hist = RunHistory(restart_times=(NOW - 300, NOW - 200, NOW - 100), last_action_at=NOW - 100)
    d = decide(obs(sub("run-a-r3", JobStatus.FAILED), hist=hist), RULES)
    assert d.action is Action.GIVE_UP and "budget of 3" in d.reason
    d2 = decide(obs(sub("run-a-r3", JobStatus.FAILED), hist=replace(hist, gave_up=True)), RULES)
    assert d2.action is Action.NOTHING and "budget" in d2.reason


def test_restarts_outside_window_do_not_count():
    """The budget is a sliding window: old restarts expire."""
    hist = RunHistory(restart_times=(NOW - 9000, NOW - 8000, NOW - 7000), last_action_at=NOW - 7000)
    d = decide(obs(sub("run-a-r3", JobStatus.FAILED), hist=hist), RULES)
    assert d.action is Action.RESUBMIT


def test_backoff_delays_quick_repeat_restarts():
    """Second restart within the window waits base s after the last action; third waits 2*base."""
    hist = RunHistory(restart_times=(NOW - 4,), last_action_at=NOW - 4, submissions=("run-a-r1",))
    d = decide(obs(sub("run-a-r1", JobStatus.FAILED), hist=hist), RULES)
    assert d.action is Action.RESUBMIT and d.delay_s == pytest.approx(6.0) and not d.acts_now
    hist2 = RunHistory(restart_times=(NOW - 50, NOW - 4), last_action_at=NOW - 4)
    assert decide(obs(sub("run-a-r2", JobStatus.FAILED), hist=hist2), RULES).delay_s == (
        pytest.approx(16.0))
    later = decide(obs(sub("run-a-r2", JobStatus.FAILED), hist=hist2, now=NOW + 20), RULES)
    assert later.acts_now and later.submission_id == "run-a-r3"


def test_backoff_is_capped():
    """Backoff never exceeds backoff_max_s."""
    assert [backoff_s(RULES, n) for n in range(6)] == [0.0, 10.0, 20.0, 40.0, 60.0, 60.0]


def test_kinds_not_acted_on():
    """MFU low / loss not finite page a human; they do not restart the job."""
    for kind in (IncidentKind.MFU_LOW, IncidentKind.LOSS_NOT_FINITE, IncidentKind.UNKNOWN):
        d = decide(obs(sub("run-a-r0", JobStatus.FAILED), inc=incident(kind=kind)), RULES)
        assert d.action is Action.NOTHING and kind.value in d.reason


def test_submission_ids_never_repeat():
    """Next id is above every id seen in Ray and in history, whatever the order."""
    assert next_submission_id("run-a", ()) == "run-a-r1"
    assert next_submission_id("run-a", ("raysubmit_XYZ", "run-a-r4", "run-a-r2")) == "run-a-r5"
    assert next_submission_id("run-a", ("run-ab-r9",)) == "run-a-r1"
    assert restart_number("run-a") == -1 and restart_number("run-a-r12") == 12
    hist = RunHistory(submissions=("run-a-r7",))
    assert decide(obs(sub("run-a-r3", JobStatus.FAILED), hist=hist), RULES).submission_id == (
        "run-a-r8")


def test_look_alike_ids_of_another_run_are_not_counted():
    """`run-a-run-7-r9` starts with `run-a-r` but is another run's: not a restart of run-a."""
    assert next_submission_id("run-a", ("run-a-run-7-r9", "run-a-r2")) == "run-a-r3"
    assert next_submission_id("run-a", ("run-a-r\u0669",)) == "run-a-r1"  # a non-ASCII digit
