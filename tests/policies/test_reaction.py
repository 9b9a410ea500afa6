"""ReactionPolicy: every rule on synthetic observations, and merge() of pending drains."""

from __future__ import annotations

import pytest

from policies.causes import StopCause
from policies.health import HealthPolicy, HealthReport
from policies.reaction import (
    Reaction,
    ReactionKind,
    ReactionObservation,
    ReactionPolicy,
    merge,
)

MESH = frozenset({"n0", "n1", "n2", "n3"})
NOW = 1_000_000.0


def obs(kind: str, targets=(), *, job_wide=False, mesh=MESH, **kw) -> ReactionObservation:
    return ReactionObservation(now=NOW, kind=kind, targets=frozenset(targets),
                               job_wide=job_wide, mesh_hosts=mesh, **kw)


POLICY = ReactionPolicy()


@pytest.mark.parametrize("kind", ["preemption_notice", "maintenance_scheduled", "host_lost",
                                  "operator_drain", "operator_stop", "host_unhealthy",
                                  "alert_firing", "live_migration"])
def test_no_targets_and_not_job_wide_is_ignored_with_reason(kind):
    """An event naming no host of the run and not the job is ignored, and says so."""
    r = POLICY.decide(obs(kind))
    assert r.kind is ReactionKind.IGNORE
    assert "names no host" in r.reason
    assert not r.drains


def test_targeted_preemption_drains_now_without_the_named_hosts():
    """A preemption of one host: drain now, that host doomed, deadline carried."""
    r = POLICY.decide(obs("preemption_notice", {"n1"}, deadline=NOW + 30))
    assert (r.kind, r.cause, r.doomed, r.deadline) == (
        ReactionKind.DRAIN_NOW, StopCause.SPOT_PREEMPTION, frozenset({"n1"}), NOW + 30)
    assert r.drains


def test_job_wide_preemption_dooms_every_mesh_host():
    """A job-wide notice must never re-form on the hosts it dooms."""
    r = POLICY.decide(obs("preemption_notice", job_wide=True, deadline=NOW + 30))
    assert r.kind is ReactionKind.DRAIN_NOW
    assert r.doomed == MESH


def test_job_wide_maintenance_dooms_every_mesh_host():
    """Job-wide maintenance near its window: drain now, every mesh host doomed."""
    r = POLICY.decide(obs("maintenance_scheduled", job_wide=True, window_start=NOW + 60))
    assert (r.kind, r.doomed, r.cause) == (ReactionKind.DRAIN_NOW, MESH, StopCause.MAINTENANCE)


def test_job_wide_notice_without_a_mesh_is_noted():
    """No mesh formed and none before: nothing to drain; the notice is recorded."""
    r = POLICY.decide(obs("preemption_notice", job_wide=True, mesh=frozenset()))
    assert r.kind is ReactionKind.NOTE and r.doomed == frozenset()
    assert "no mesh" in r.reason and "nothing to drain" in r.reason


def test_job_wide_notice_between_meshes_dooms_the_last_meshs_hosts():
    """In backoff or waiting for capacity, a job-wide notice is about the hosts the job held:
    they are kept out of the next mesh (it used to re-form on them)."""
    r = POLICY.decide(obs("preemption_notice", job_wide=True, mesh=frozenset(),
                          job_hosts=MESH))
    assert (r.kind, r.doomed) == (ReactionKind.NOTE, MESH)
    assert "keep its last hosts out of the next mesh" in r.reason
    m = POLICY.decide(obs("maintenance_scheduled", job_wide=True, mesh=frozenset(),
                          job_hosts=MESH, window_start=NOW + 60))
    assert (m.kind, m.doomed) == (ReactionKind.NOTE, MESH)


def test_job_wide_maintenance_days_ahead_between_meshes_dooms_nothing_yet():
    """A window two days away: the hosts are fine until then. The notice is a NOTE that keeps
    its deadline, which the controller defers and decides again on the next mesh (a NOTE with
    doomed hosts and no deadline would exclude them for good)."""
    for step_time in (None, 0.05):
        r = POLICY.decide(obs("maintenance_scheduled", job_wide=True, mesh=frozenset(),
                              job_hosts=MESH, window_start=NOW + 2 * 86400,
                              step_time_s=step_time))
        assert (r.kind, r.deadline) == (ReactionKind.NOTE, NOW + 2 * 86400), step_time
        assert not r.drains


def test_every_reaction_cause_comes_from_the_classifier_table():
    """One table: the cause a drain carries is the one the failure classifier gives its kind."""
    from policies.causes import StopObservation, classify

    for kind, kw in [("preemption_notice", {}), ("host_lost", {}), ("slice_lost", {}),
                     ("operator_drain", {}), ("operator_stop", {}),
                     ("maintenance_scheduled", {"window_start": NOW + 60}),
                     ("host_unhealthy", {})]:
        r = POLICY.decide(obs(kind, {"n1"}, deadline=NOW + 30, **kw))
        assert r.cause is classify(StopObservation(event_kind=kind)).cause, kind


def test_targets_outside_the_mesh_are_noted_and_kept_out():
    """A preemption of a host outside the current mesh does not drain it."""
    r = POLICY.decide(obs("preemption_notice", {"spare"}))
    assert r.kind is ReactionKind.NOTE
    assert r.doomed == frozenset({"spare"})
    assert not r.drains


def test_targets_named_before_a_mesh_forms_are_doomed():
    """While the mesh is forming, named hosts are doomed so it does not land on them."""
    r = POLICY.decide(obs("preemption_notice", {"n1"}, mesh=frozenset()))
    assert (r.kind, r.doomed) == (ReactionKind.DRAIN_NOW, frozenset({"n1"}))


@pytest.mark.parametrize("kind", ["host_lost", "slice_lost"])
def test_announced_loss_drains_now_without_the_targets(kind):
    """host_lost / slice_lost: drain now, named hosts doomed, cause HOST_LOST."""
    r = POLICY.decide(obs(kind, {"n2", "n3"}))
    assert (r.kind, r.doomed, r.cause) == (
        ReactionKind.DRAIN_NOW, frozenset({"n2", "n3"}), StopCause.HOST_LOST)


def test_operator_stop_stops():
    """operator_stop: STOP with cause OPERATOR."""
    r = POLICY.decide(obs("operator_stop", job_wide=True))
    assert (r.kind, r.cause) == (ReactionKind.STOP, StopCause.OPERATOR)
    assert r.drains


def test_operator_drain_job_wide_drains_without_dooming():
    """A job-wide operator drain re-forms in place: nothing doomed."""
    r = POLICY.decide(obs("operator_drain", job_wide=True))
    assert (r.kind, r.cause, r.doomed) == (
        ReactionKind.DRAIN_NOW, StopCause.OPERATOR, frozenset())


def test_operator_drain_of_a_host_dooms_it():
    """An operator drain naming a host leaves that host out."""
    r = POLICY.decide(obs("operator_drain", {"n0"}))
    assert (r.kind, r.doomed) == (ReactionKind.DRAIN_NOW, frozenset({"n0"}))


@pytest.mark.parametrize("kind", ["operator_resume", "alert_firing", "alert_resolved",
                                  "live_migration"])
def test_record_only_kinds_are_noted(kind):
    """Resume, alerts and live migration never drain."""
    r = POLICY.decide(obs(kind, {"n0"}, job_wide=True, deadline=NOW + 60))
    assert r.kind is ReactionKind.NOTE
    assert not r.drains and not r.doomed


def test_unknown_kind_is_noted_not_raised():
    """A kind the policy does not know is recorded, never a crash."""
    assert POLICY.decide(obs("solar_flare", {"n0"})).kind is ReactionKind.NOTE


# ---- maintenance -----------------------------------------------------------------------------


def test_maintenance_far_ahead_drains_at_a_step_lead_before_the_window():
    """Window 2 h ahead, 10 s steps, 50 s save: drain lands lead+save before the window."""
    r = POLICY.decide(obs("maintenance_scheduled", {"n1"}, window_start=NOW + 7200,
                          window_end=NOW + 10800, step=100, step_time_s=10.0,
                          expected_save_s=50.0))
    assert r.kind is ReactionKind.DRAIN_AT_STEP
    assert r.at_step == 100 + (7200 - 600 - 50) // 10
    assert (r.deadline, r.doomed, r.cause) == (NOW + 7200, frozenset({"n1"}),
                                               StopCause.MAINTENANCE)
    assert r.drains


def test_maintenance_lead_is_tunable():
    """A longer lead moves the drain step earlier."""
    early = ReactionPolicy(maintenance_lead_s=3600).decide(
        obs("maintenance_scheduled", {"n1"}, window_start=NOW + 7200, step_time_s=10.0))
    assert early.at_step == (7200 - 3600) // 10


def test_maintenance_far_ahead_without_step_time_waits():
    """No step time yet and the window far: noted with 'waiting for a step time'."""
    r = POLICY.decide(obs("maintenance_scheduled", {"n1"}, window_start=NOW + 86400))
    assert r.kind is ReactionKind.NOTE
    assert "waiting for a step time" in r.reason
    assert not r.drains


def test_maintenance_near_without_step_time_drains_now():
    """No step time but the window within the lead: drain now with the window as deadline."""
    r = POLICY.decide(obs("maintenance_scheduled", {"n1"}, window_start=NOW + 300))
    assert (r.kind, r.deadline) == (ReactionKind.DRAIN_NOW, NOW + 300)


def test_maintenance_window_started_drains_now():
    """Window already open: drain now; deadline is the window start."""
    r = POLICY.decide(obs("maintenance_scheduled", {"n1"}, window_start=NOW - 10,
                          window_end=NOW + 3600, step_time_s=1.0))
    assert (r.kind, r.deadline) == (ReactionKind.DRAIN_NOW, NOW - 10)
    assert "started" in r.reason


def test_maintenance_with_less_than_a_step_to_spare_drains_now():
    """Steps so long that none fits before the lead: drain now."""
    r = POLICY.decide(obs("maintenance_scheduled", {"n1"}, window_start=NOW + 700,
                          step_time_s=200.0))
    assert r.kind is ReactionKind.DRAIN_NOW


def test_maintenance_window_over_is_noted():
    """A window that already ended needs no drain."""
    r = POLICY.decide(obs("maintenance_scheduled", {"n1"}, window_start=NOW - 7200,
                          window_end=NOW - 3600))
    assert r.kind is ReactionKind.NOTE


def test_maintenance_deadline_used_when_no_window():
    """A 60 s maintenance notice (deadline, no window) drains now against that deadline."""
    r = POLICY.decide(obs("maintenance_scheduled", {"n1"}, deadline=NOW + 60))
    assert (r.kind, r.deadline) == (ReactionKind.DRAIN_NOW, NOW + 60)


def test_negative_lead_rejected_with_setting_name():
    """Config errors name the setting."""
    with pytest.raises(ValueError, match="maintenance_lead_s"):
        ReactionPolicy(maintenance_lead_s=-1)


# ---- health -----------------------------------------------------------------------------------


def test_single_unhealthy_report_is_noted():
    """Below cordon_after, an unhealthy report is only watched."""
    r = POLICY.decide(obs("host_unhealthy", {"n1"}))
    assert (r.kind, r.cause) == (ReactionKind.NOTE, StopCause.HARDWARE_HEALTH)


def test_unhealthy_over_threshold_cordons_and_replaces():
    """Three reports in the window: cordon the host and drain it now."""
    reports = tuple(HealthReport(host="n1", at=NOW - d, healthy=False) for d in (20, 10, 0))
    r = POLICY.decide(obs("host_unhealthy", {"n1"}, health_reports=reports))
    assert (r.kind, r.cordon, r.doomed, r.not_before) == (
        ReactionKind.CORDON_AND_REPLACE, frozenset({"n1"}), frozenset({"n1"}), None)
    assert r.drains


def test_fatal_report_cordons_at_once():
    """A fatal report cordons without waiting for the count."""
    reports = (HealthReport(host="n2", at=NOW, healthy=False, fatal=True),)
    r = POLICY.decide(obs("host_unhealthy", {"n2"}, health_reports=reports))
    assert r.kind is ReactionKind.CORDON_AND_REPLACE


def test_health_drain_rate_limited_sets_not_before():
    """A second health drain soon after the last one is cordoned now, drained later."""
    reports = (HealthReport(host="n2", at=NOW, healthy=False, fatal=True),)
    r = POLICY.decide(obs("host_unhealthy", {"n2"}, health_reports=reports,
                          last_health_drain_at=NOW - 10))
    assert r.kind is ReactionKind.CORDON_AND_REPLACE
    assert r.not_before == NOW - 10 + HealthPolicy().min_drain_interval_s


def test_unhealthy_host_outside_mesh_is_cordoned_only():
    """Not in the mesh: cordon, nothing to drain."""
    reports = (HealthReport(host="x", at=NOW, healthy=False, fatal=True),)
    r = POLICY.decide(obs("host_unhealthy", {"x"}, health_reports=reports))
    assert (r.kind, r.cordon, r.doomed) == (
        ReactionKind.CORDON_AND_REPLACE, frozenset({"x"}), frozenset())
    assert not r.drains


def test_already_cordoned_is_noted():
    """A host cordoned earlier is not cordoned twice."""
    r = POLICY.decide(obs("host_unhealthy", {"n1"}, cordoned=frozenset({"n1"})))
    assert r.kind is ReactionKind.NOTE


def test_job_wide_health_report_is_noted():
    """A health report naming no host cannot cordon the whole job."""
    r = POLICY.decide(obs("host_unhealthy", job_wide=True))
    assert r.kind is ReactionKind.NOTE


def test_health_policy_is_composed():
    """A custom HealthPolicy (cordon_after=1) is the one consulted."""
    policy = ReactionPolicy(health=HealthPolicy(cordon_after=1))
    assert policy.decide(obs("host_unhealthy", {"n1"})).kind is ReactionKind.CORDON_AND_REPLACE


# ---- merge ------------------------------------------------------------------------------------


def _r(kind, **kw) -> Reaction:
    return Reaction(kind=kind, reason=str(kind), **kw)


def test_merge_unions_hosts_and_takes_earliest_deadline():
    """Two drains: union of doomed and cordon, earliest deadline."""
    a = _r(ReactionKind.DRAIN_NOW, doomed=frozenset({"a"}), deadline=NOW + 60,
           cause=StopCause.SPOT_PREEMPTION)
    b = _r(ReactionKind.CORDON_AND_REPLACE, doomed=frozenset({"b"}), cordon=frozenset({"b"}),
           deadline=NOW + 30, cause=StopCause.HARDWARE_HEALTH)
    m = merge(a, b)
    assert (m.kind, m.doomed, m.cordon, m.deadline) == (
        ReactionKind.CORDON_AND_REPLACE, frozenset({"a", "b"}), frozenset({"b"}), NOW + 30)
    swapped = merge(b, a)
    assert (swapped.kind, swapped.doomed, swapped.cordon, swapped.deadline) == (
        m.kind, m.doomed, m.cordon, m.deadline)


def test_merge_takes_earliest_at_step():
    """Two step-scheduled drains: the earliest step."""
    m = merge(_r(ReactionKind.DRAIN_AT_STEP, at_step=500), _r(ReactionKind.DRAIN_AT_STEP,
                                                              at_step=300))
    assert (m.kind, m.at_step) == (ReactionKind.DRAIN_AT_STEP, 300)


def test_merge_drain_now_beats_drain_at_step():
    """A drain due now makes the step-scheduled one happen now too."""
    m = merge(_r(ReactionKind.DRAIN_AT_STEP, at_step=500, doomed=frozenset({"a"})),
              _r(ReactionKind.DRAIN_NOW, doomed=frozenset({"b"})))
    assert (m.kind, m.at_step, m.doomed) == (ReactionKind.DRAIN_NOW, None,
                                             frozenset({"a", "b"}))


@pytest.mark.parametrize("other", list(ReactionKind))
def test_merge_stop_dominates(other):
    """STOP wins over everything, in either order."""
    stop = _r(ReactionKind.STOP, cause=StopCause.OPERATOR)
    assert merge(stop, _r(other)).kind is ReactionKind.STOP
    assert merge(_r(other), stop).kind is ReactionKind.STOP
    assert merge(_r(other), stop).cause is StopCause.OPERATOR


def test_merge_cordon_only_keeps_the_scheduled_drain():
    """Cordoning a host outside the mesh does not pull a scheduled drain forward."""
    m = merge(_r(ReactionKind.CORDON_AND_REPLACE, cordon=frozenset({"x"})),
              _r(ReactionKind.DRAIN_AT_STEP, at_step=50, doomed=frozenset({"a"})))
    assert (m.kind, m.at_step, m.cordon, m.doomed) == (
        ReactionKind.DRAIN_AT_STEP, 50, frozenset({"x"}), frozenset({"a"}))


def test_merge_deferred_health_drain_is_absorbed_by_a_drain_now():
    """A rate-limited health drain rides along with a preemption drain now."""
    deferred = _r(ReactionKind.CORDON_AND_REPLACE, doomed=frozenset({"h"}),
                  cordon=frozenset({"h"}), not_before=NOW + 50)
    m = merge(deferred, _r(ReactionKind.DRAIN_NOW, doomed=frozenset({"p"})))
    assert m.not_before is None
    assert m.doomed == frozenset({"h", "p"})
    both = merge(deferred, _r(ReactionKind.CORDON_AND_REPLACE, doomed=frozenset({"g"}),
                              not_before=NOW + 20))
    assert both.not_before == NOW + 20


def test_merge_with_ignore_keeps_the_drain_reason():
    """Merging with an IGNORE changes nothing but nothing is lost."""
    a = _r(ReactionKind.DRAIN_NOW, doomed=frozenset({"a"}), deadline=NOW)
    assert merge(a, _r(ReactionKind.IGNORE)) == a


def test_a_drain_step_chosen_ahead_is_pulled_earlier_when_steps_run_slower():
    """Chosen at 1 s/step for a window 10,000 s away; steps now take 2 s: the drain must
    still land the lead (600 s) plus the save (10 s) before the window."""
    p = ReactionPolicy()
    got = p.revise_drain_step(at_step=9_390, deadline=10_000.0, now=1_000.0, step=1_000,
                              step_time_s=2.0, expected_save_s=10.0)
    assert got == 1_000 + (10_000 - 1_000 - 600 - 10) // 2
    # faster steps never push it later; no step time or a passed step leaves it alone
    assert p.revise_drain_step(at_step=9_390, deadline=10_000.0, now=1_000.0, step=1_000,
                               step_time_s=0.5, expected_save_s=None) == 9_390
    assert p.revise_drain_step(at_step=9_390, deadline=10_000.0, now=1_000.0, step=1_000,
                               step_time_s=None, expected_save_s=None) == 9_390
    # past the point of safety: drain at once (the current step), never earlier
    assert p.revise_drain_step(at_step=9_390, deadline=10_000.0, now=9_900.0, step=5_000,
                               step_time_s=2.0, expected_save_s=10.0) == 5_000
