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


def test_tpu_worker_resource_targets_its_slice():
    """Cloud TPU's tpu_worker resource names the TPU node, which is one slice."""
    event = parse_alert_notification(load_fixture("monitoring_alert_tpu_worker_open.json"), now=1)
    assert event.target.slice == "slice-a"
    assert event.target.host is None


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
        (lambda p: p["incident"].update(state=3), "must be a string"),
        (lambda p: p.update(version="2.0"), "unsupported alert notification version"),
        (lambda p: p["incident"].update(started_at="yesterday"), "unix seconds"),
        (lambda p: p["incident"].update(resource=[1, 2]), "resource must be an object"),
        (lambda p: p["incident"]["metric"].update(labels={"instance_name": [1]}), "string"),
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
