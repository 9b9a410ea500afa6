"""Cloud Monitoring notification-channel JSON -> ALERT_FIRING / ALERT_RESOLVED."""

from __future__ import annotations

import copy

import pytest

from orchestrator.events.alerts import parse_alert_notification
from orchestrator.events.model import EventKind, MalformedEvent
from tests.events.conftest import load_fixture


def test_open_incident_becomes_alert_firing_for_named_host():
    """An open incident targets the instance in the metric labels and the job user label."""
    event = parse_alert_notification(load_fixture("monitoring_alert_incident_open.json"), now=5.0)
    assert event.kind is EventKind.ALERT_FIRING
    assert (event.target.job, event.target.host, event.target.slice) == ("demo", "tpu-host-a-0",
                                                                         None)
    assert event.id == "alert:0.opqiw61fsv7p:open"
    assert event.observed_at == 5.0
    assert event.occurred_at == 1577840461.0
    assert event.labels["alert.policy_name"] == "Training host unhealthy"
    assert event.raw["incident"]["incident_id"] == "0.opqiw61fsv7p"


def test_closed_incident_becomes_alert_resolved_with_a_different_id():
    """Closing the incident is a new event (its own id), timed at ended_at."""
    opened = parse_alert_notification(load_fixture("monitoring_alert_incident_open.json"), now=1)
    closed = parse_alert_notification(load_fixture("monitoring_alert_incident_closed.json"), now=2)
    assert closed.kind is EventKind.ALERT_RESOLVED
    assert closed.id != opened.id
    assert closed.occurred_at == 1577877071.0


def test_tpu_worker_resource_targets_its_worker_in_its_slice():
    """Cloud TPU's tpu_worker resource: node_id is the slice, worker_id the host in it."""
    event = parse_alert_notification(load_fixture("monitoring_alert_tpu_worker_open.json"), now=1)
    assert event.target.slice == "slice-a"
    assert (event.target.host, event.target.host_kind) == ("1", "tpu_worker")


def test_state_is_case_insensitive():
    """The channel's test notification sends OPEN in capitals."""
    payload = load_fixture("monitoring_alert_incident_open.json")
    payload["incident"]["state"] = "OPEN"
    assert parse_alert_notification(payload, now=1).kind is EventKind.ALERT_FIRING


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda p: p.pop("incident"), "no `incident`"),
        (lambda p: p["incident"].pop("incident_id"), "incident_id is missing"),
        (lambda p: p["incident"].update(state="acknowledged"), "open or closed"),
        (lambda p: p["incident"].update(state=3), "open or closed"),
        (lambda p: p.update(version="2.0"), "unsupported alert notification version"),
        (lambda p: p["incident"].update(resource=[1, 2]), "resource must be an object"),
    ],
)
def test_malformed_notifications_raise_with_reason(mutate, reason):
    """Every malformation yields MalformedEvent whose reason names the problem."""
    payload = copy.deepcopy(load_fixture("monitoring_alert_incident_open.json"))
    mutate(payload)
    with pytest.raises(MalformedEvent) as info:
        parse_alert_notification(payload, now=1)
    assert reason in info.value.reason


def test_non_object_payload_is_malformed():
    """A list or a string is not a notification."""
    with pytest.raises(MalformedEvent):
        parse_alert_notification(["incident"], now=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mutate", "note"),
    [
        (lambda p: p["incident"].update(started_at="yesterday"), "incident.started_at"),
        (lambda p: p["incident"].update(started_at=1577840461000), "milliseconds"),
        (lambda p: p["incident"].update(summary=["x"]), "incident.summary"),
        (lambda p: p["incident"]["metadata"].update(user_labels={"team": [1]}), "team"),
    ],
)
def test_wrong_type_in_a_field_that_decides_nothing_is_ignored_with_a_note(mutate, note):
    """Strictness only where it matters: a bad informational field is noted, not fatal."""
    payload = copy.deepcopy(load_fixture("monitoring_alert_incident_open.json"))
    mutate(payload)
    event = parse_alert_notification(payload, now=1)
    assert event.kind is EventKind.ALERT_FIRING
    assert note in event.labels["parse.ignored"]


def test_non_string_instance_name_is_not_a_host():
    """A metric label that is not a string names nothing: the instance id is used instead."""
    payload = copy.deepcopy(load_fixture("monitoring_alert_incident_open.json"))
    payload["incident"]["metric"]["labels"] = {"instance_name": [1]}
    event = parse_alert_notification(payload, now=1)
    assert (event.target.host, event.target.host_kind) == ("11223344", "instance_id")


def test_user_labels_are_readable_by_the_attribute_filters():
    """Regression: user labels were stored as alert.<key> while filters read <key>."""
    from orchestrator.events.relevance import relevance

    event = parse_alert_notification(load_fixture("monitoring_alert_incident_open.json"), now=1)
    assert event.labels["team"] == "training"  # metadata.user_labels
    assert relevance(event, job="demo", filters={"team": "training"}).accepted
    assert relevance(event, job="demo", filters={"team": "infra"}).decision == "irrelevant"


def test_uptime_check_host_label_is_not_a_host():
    """An uptime check names a URL's host, not a VM: no host target; the intake dead-letters."""
    payload = copy.deepcopy(load_fixture("monitoring_alert_incident_open.json"))
    payload["incident"]["resource"] = {"type": "uptime_url",
                                       "labels": {"host": "vm-1", "project_id": "p"}}
    payload["incident"]["metric"] = {"type": "monitoring.googleapis.com/uptime_check/check_passed",
                                     "labels": {"check_id": "c"}}
    payload["incident"]["policy_user_labels"] = {}
    event = parse_alert_notification(payload, now=1)
    assert event.target.host is None
    with pytest.raises(MalformedEvent, match="names no host"):
        parse_alert_notification(payload, now=1, require_target=True)


@pytest.mark.parametrize(
    ("resource", "metric", "expected"),
    [
        ({"type": "k8s_node", "labels": {"node_name": "gke-n-1", "cluster_name": "c1"}}, {},
         {"host": "gke-n-1", "host_kind": "node_name", "cluster": "c1"}),
        ({"type": "k8s_container", "labels": {"cluster_name": "c1", "pod_name": "p"}}, {},
         {"host": None, "cluster": "c1"}),
        ({"type": "tpu.googleapis.com/GceTpuWorker", "labels": {}},
         {"labels": {"instance_name": "t1v-n-1-w-0"}},
         {"host": "t1v-n-1-w-0", "host_kind": "instance"}),
        ({"type": "generic_task", "labels": {"job": "demo", "task_id": "3"}}, {},
         {"host": None, "job": "demo"}),
    ],
)
def test_targets_by_resource_type(resource, metric, expected):
    """Each resource type is targeted through the labels that name a host for it."""
    payload = copy.deepcopy(load_fixture("monitoring_alert_incident_open.json"))
    payload["incident"]["resource"] = resource
    payload["incident"]["metric"] = metric
    payload["incident"]["policy_user_labels"] = {}
    payload["incident"]["metadata"] = {}
    target = parse_alert_notification(payload, now=1).target.to_json()
    assert {k: target.get(k) for k in expected} == expected
