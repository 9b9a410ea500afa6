"""Pure relevance and staleness rules."""

from __future__ import annotations

from orchestrator.events.model import EventKind
from orchestrator.events.relevance import relevance, staleness, target_hosts
from tests.events.helpers import event, hosts


def test_other_jobs_events_are_irrelevant():
    """target.job or a job label naming another job -> irrelevant."""
    assert relevance(event(job="other"), job="mine").decision == "irrelevant"
    assert relevance(event(labels={"job": "other"}), job="mine").decision == "irrelevant"
    assert relevance(event(job="mine"), job="mine").accepted
    assert relevance(event(), job="mine").accepted


def test_attribute_filters_must_match():
    """Configured filters are matched against message attributes (then labels)."""
    verdict = relevance(event(), job="j", attributes={"cluster": "b"}, filters={"cluster": "a"})
    assert verdict.decision == "irrelevant" and "cluster" in verdict.reason
    matched = relevance(event(), job="j", attributes={"cluster": "a"}, filters={"cluster": "a"})
    assert matched.accepted


def test_host_not_in_mesh_is_stale():
    """A host index / name outside the current mesh is stale."""
    verdict = staleness(event(host="7"), hosts=hosts(2), incarnation=0, now=0)
    assert verdict.decision == "stale" and "not in the mesh" in verdict.reason
    for name in ("1", "vm-1", "node1", "10.0.0.2"):
        assert staleness(event(host=name), hosts=hosts(2), incarnation=0, now=0).accepted


def test_slice_rules():
    """A slice target must exist; host+slice must agree."""
    hs = hosts(2, "slice-a")
    assert staleness(event(host=None, slice_name="slice-b"), hosts=hs, incarnation=0,
                     now=0).decision == "stale"
    assert staleness(event(host=None, slice_name="slice-a"), hosts=hs, incarnation=0,
                     now=0).accepted
    assert staleness(event(host="1", slice_name="slice-b"), hosts=hs, incarnation=0,
                     now=0).decision == "stale"


def test_deadline_passed_only_matters_for_notices():
    """A notice past its deadline is stale; an alert with a past deadline is not a notice."""
    assert staleness(event(deadline=10), hosts=hosts(), incarnation=0, now=11).decision == "stale"
    assert staleness(event(deadline=10), hosts=hosts(), incarnation=0, now=10).accepted
    assert staleness(event(deadline=10), hosts=hosts(), incarnation=0, now=12, grace_s=5).accepted
    alert = event(EventKind.ALERT_FIRING, deadline=10)
    assert staleness(alert, hosts=hosts(), incarnation=0, now=50).accepted


def test_older_incarnation_is_stale():
    """Events stamped with an older incarnation are dropped."""
    assert staleness(event(incarnation=1), hosts=hosts(), incarnation=2,
                     now=0).decision == "stale"
    assert staleness(event(incarnation=2), hosts=hosts(), incarnation=2, now=0).accepted


def test_job_wide_event_targets_all_hosts():
    """No host and no slice = the whole job."""
    hs = hosts(3)
    assert target_hosts(event(EventKind.OPERATOR_STOP, host=None), hs) == hs
    assert [h.index for h in target_hosts(event(host="vm-2"), hs)] == [2]
