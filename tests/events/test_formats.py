"""Every documented notice form maps to the right kind, in either proto3 JSON spelling, with
plausible times, and strict only in the fields that decide what happens."""

from __future__ import annotations

import copy
import json
import re

import pytest

from orchestrator.events.model import Event, EventKind, MalformedEvent
from orchestrator.events.parsing import parse_bytes, parse_value
from orchestrator.events.timefmt import parse_rfc3339
from policies.reaction import ReactionKind, ReactionObservation, ReactionPolicy
from tests.events.conftest import load_fixture

NOW = 1_731_038_452.0  # just after the upcoming-maintenance entry was written
UPCOMING = "logentry_gce_compute_instances_upcomingMaintenance_ASSEMBLED.json"
PREEMPTED = "logentry_gce_compute_instances_preempted_real_gcpdiag.json"


def _parse(doc, now=NOW) -> Event:
    return parse_bytes(json.dumps(doc).encode(), now=now, source="t")


def to_snake(value, *, keep=("labels", "annotations", "attributes")):
    """Rename every lowerCamelCase key to snake_case (map fields in ``keep`` left alone)."""
    if isinstance(value, list):
        return [to_snake(v, keep=keep) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        new = key if key.startswith("@") else re.sub(r"(?<=[a-z0-9])([A-Z])",
                                                     lambda m: "_" + m.group(1).lower(), key)
        out[new] = item if key in keep else to_snake(item, keep=keep)
    return out


# ---- upcoming maintenance -------------------------------------------------------------------

def test_upcoming_maintenance_is_scheduled_with_its_window():
    """compute.instances.upcomingMaintenance: window, status, canReschedule; deadline = start."""
    ev = _parse(load_fixture(UPCOMING))
    assert ev.kind is EventKind.MAINTENANCE_SCHEDULED
    assert (ev.target.host, ev.target.host_kind) == ("t1v-n-9472280f-w-0", "instance")
    assert ev.window_start == parse_rfc3339("2024-11-15T04:00:00Z", "t")
    assert ev.window_end == parse_rfc3339("2024-11-15T08:00:00Z", "t")
    assert ev.deadline == ev.window_start
    assert ev.labels["maintenance.status"] == "PENDING"
    assert ev.labels["maintenance.can_reschedule"] == "true"
    assert ev.labels["maintenance.type"] == "SCHEDULED"
    back = Event.from_json(json.loads(json.dumps(ev.to_json())))
    assert (back.window_start, back.window_end) == (ev.window_start, ev.window_end)


def test_upcoming_maintenance_days_ahead_is_drained_at_a_step_not_at_60s():
    """The reaction to the week-ahead notice: a drain step before the window."""
    ev = _parse(load_fixture(UPCOMING))
    r = ReactionPolicy().decide(ReactionObservation(
        now=NOW, kind=ev.kind.value, targets=frozenset({"n0"}), job_wide=False,
        mesh_hosts=frozenset({"n0", "n1"}), deadline=ev.deadline, window_start=ev.window_start,
        window_end=ev.window_end, step=10, step_time_s=2.0, expected_save_s=30.0))
    assert r.kind is ReactionKind.DRAIN_AT_STEP
    assert r.deadline == ev.window_start and r.at_step > 10


def test_a_rescheduled_window_is_a_new_event():
    """A new window for the same operation must not be dropped as a duplicate."""
    doc = load_fixture(UPCOMING)
    moved = copy.deepcopy(doc)
    moved["protoPayload"]["metadata"]["windowStartTime"] = "2024-11-16T04:00:00Z"
    assert _parse(doc).id != _parse(moved).id


def test_ongoing_maintenance_keeps_its_window():
    """maintenanceStatus ONGOING: still maintenance (the window has started)."""
    doc = load_fixture(UPCOMING)
    doc["protoPayload"]["metadata"]["maintenanceStatus"] = "ONGOING"
    ev = _parse(doc, now=parse_rfc3339("2024-11-15T05:00:00Z", "t"))
    assert ev.kind is EventKind.MAINTENANCE_SCHEDULED
    assert ev.labels["maintenance.status"] == "ONGOING"


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda m: m.pop("windowStartTime"), "windowStartTime"),
    (lambda m: m.update(windowStartTime="next tuesday"), "not an RFC 3339"),
    (lambda m: m.update(windowStartTime=1731643200), "RFC 3339"),
])
def test_window_start_decides_so_it_is_strict(mutate, reason):
    """Without a usable window start the notice cannot be acted on: dead letter with reason."""
    doc = load_fixture(UPCOMING)
    mutate(doc["protoPayload"]["metadata"])
    with pytest.raises(MalformedEvent) as info:
        _parse(doc)
    assert reason in info.value.reason


def test_informational_maintenance_fields_are_soft():
    """canReschedule / windowEndTime / status of the wrong type: noted, event kept."""
    doc = load_fixture(UPCOMING)
    doc["protoPayload"]["metadata"].update(canReschedule="maybe", windowEndTime=[1],
                                           maintenanceStatus={"x": 1})
    doc["protoPayload"]["status"] = "oops"
    ev = _parse(doc)
    assert ev.kind is EventKind.MAINTENANCE_SCHEDULED and ev.window_end is None
    for name in ("canReschedule", "windowEndTime", "maintenanceStatus", "status"):
        assert name in ev.labels["parse.ignored"]


# ---- other GCE and GKE forms ----------------------------------------------------------------

@pytest.mark.parametrize(("name", "kind", "deadline", "window"), [
    ("logentry_gce_compute_instances_baremetalCaretakerPreempted_ASSEMBLED.json",
     EventKind.PREEMPTION_NOTICE, True, False),
    ("logentry_gce_compute_instances_migrateOnHostMaintenance_ASSEMBLED.json",
     EventKind.LIVE_MIGRATION, False, False),
    ("logentry_gke_node_TerminateOnHostMaintenance_ASSEMBLED.json",
     EventKind.MAINTENANCE_SCHEDULED, True, False),
    ("logentry_gke_node_MaintenanceWindowScheduled_ASSEMBLED.json",
     EventKind.MAINTENANCE_SCHEDULED, True, True),
    ("logentry_gke_node_MaintenanceWindowStarted_ASSEMBLED.json",
     EventKind.MAINTENANCE_SCHEDULED, True, True),
    ("logentry_gke_node_NodeShutdown_ASSEMBLED.json", EventKind.PREEMPTION_NOTICE, True, False),
])
def test_termination_forms_map_to_kinds(name, kind, deadline, window):
    """Bare-metal preemption, GKE host-maintenance reasons, spot shutdown, live migration."""
    ev = _parse(load_fixture(name), now=1_742_000_000.0)
    assert ev.kind is kind
    assert (ev.deadline is not None, ev.window_start is not None) == (deadline, window)


def test_gke_scheduled_window_comes_from_the_annotations():
    """maintenance.gke.io/maintenance-start-time and window-end-time are the window."""
    ev = _parse(load_fixture("logentry_gke_node_MaintenanceWindowScheduled_ASSEMBLED.json"))
    assert ev.window_start == parse_rfc3339("2025-03-27T04:00:00Z", "t")
    assert ev.window_end == parse_rfc3339("2025-03-27T08:00:00Z", "t")
    assert (ev.target.host_kind, ev.target.cluster) == ("node_name", "tpu-cluster")
    assert ev.labels["maintenance.status"] == "PENDING"


def test_gke_cancelled_window_is_noted_and_unknown_reasons_dead_letter():
    """MaintenanceWindowCancelled -> maintenance_cancelled; a random reason -> dead letter."""
    doc = load_fixture("logentry_gke_node_MaintenanceWindowScheduled_ASSEMBLED.json")
    doc["jsonPayload"]["reason"] = "MaintenanceWindowCancelled"
    assert _parse(doc).kind is EventKind.MAINTENANCE_CANCELLED
    doc["jsonPayload"]["reason"] = "PodEvictionComplete"
    with pytest.raises(MalformedEvent, match="unsupported GKE node event reason"):
        _parse(doc)
    doc["jsonPayload"]["reason"] = "MaintenanceWindowScheduled"
    del doc["jsonPayload"]["metadata"]["annotations"]
    with pytest.raises(MalformedEvent, match="maintenance-start-time"):
        _parse(doc)


def test_live_migration_is_noted_never_drained():
    """migrateOnHostMaintenance: no deadline, and the reaction is NOTE even with a mesh."""
    ev = _parse(load_fixture("logentry_gce_compute_instances_migrateOnHostMaintenance_ASSEMBLED"
                             ".json"))
    assert ev.kind is EventKind.LIVE_MIGRATION and ev.deadline is None
    r = ReactionPolicy().decide(ReactionObservation(
        now=NOW, kind=ev.kind.value, targets=frozenset({"n0"}), job_wide=False,
        mesh_hosts=frozenset({"n0"})))
    assert r.kind is ReactionKind.NOTE and not r.drains


# ---- proto3 JSON spellings ------------------------------------------------------------------

@pytest.mark.parametrize("name", [UPCOMING, PREEMPTED,
                                  "logentry_gke_node_MaintenanceWindowScheduled_ASSEMBLED.json",
                                  "monitoring_alert_incident_open.json",
                                  "pubsub_push_body_logsink_compute_instances_preempted_"
                                  "ASSEMBLED.json"])
def test_snake_case_spelling_parses_to_the_same_event(name):
    """proto3 JSON accepts snake_case field names; so do we, with the same result."""
    doc = load_fixture(name)
    camel, snake = _parse(doc), _parse(to_snake(doc))
    assert snake.to_json(with_raw=False) == camel.to_json(with_raw=False)


def test_our_schema_accepts_camel_case_and_rejects_conflicts():
    """Our own schema too: observedAt == observed_at; both with different values is an error."""
    ev = parse_value({"schemaVersion": 1, "id": "a", "kind": "preemption", "observedAt": NOW,
                      "deadline": NOW + 30, "target": {"host": "vm-1", "hostKind": "instance"}},
                     now=0, source="t")
    assert (ev.observed_at, ev.target.host_kind) == (NOW, "instance")
    with pytest.raises(MalformedEvent, match="both"):
        parse_value({"schema_version": 1, "id": "a", "kind": "stop", "observed_at": 1.0,
                     "observedAt": 2.0}, now=0, source="t")


# ---- times ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("2025-03-17T06:00:14Z", 1742191214.0),
    ("2025-03-17T06:00:14.413235Z", 1742191214.413235),
    ("2025-03-17T06:00:14.123456789Z", 1742191214.123456789),
    ("2025-03-16T23:00:14-07:00", 1742191214.0),
    ("2025-03-17T07:00:14.5+01:00", 1742191214.5),
    ("2025-03-17T06:00:14", 1742191214.0),  # no offset: UTC
    ("2025-03-17 06:00:14z", 1742191214.0),
])
def test_rfc3339_with_and_without_fractions_and_offsets(text, expected):
    """Every RFC 3339 variant Google writes."""
    assert parse_rfc3339(text, "t") == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("doc", "reason"), [
    ({"schema_version": 1, "id": "a", "kind": "preemption", "deadline": 1742191244000},
     "milliseconds"),
    ({"schema_version": 1, "id": "a", "kind": "preemption", "deadline": 1742191244000 * 1000},
     "after the year 2100"),
    ({"schema_version": 1, "id": "a", "kind": "stop", "observed_at": -5}, "plausible"),
])
def test_implausible_unix_times_are_rejected_with_a_reason(doc, reason):
    """Year 57304 (milliseconds read as seconds) is a dead letter that says so."""
    with pytest.raises(MalformedEvent) as info:
        parse_value(doc, now=NOW, source="t")
    assert reason in info.value.reason


def test_implausible_timestamp_on_a_notice_is_a_dead_letter():
    """A preemption's timestamp decides its deadline: year 57304 is rejected with a reason."""
    doc = load_fixture(PREEMPTED)
    doc["timestamp"] = "57304-01-01T00:00:00Z"
    with pytest.raises(MalformedEvent, match="timestamp"):
        _parse(doc)
    doc["timestamp"] = "1970-01-01T00:00:05Z"
    with pytest.raises(MalformedEvent, match="not plausible"):
        _parse(doc)


def test_timestamp_that_decides_nothing_is_soft():
    """hostError has no deadline: a broken timestamp is noted, the loss still reported."""
    doc = load_fixture("logentry_gce_compute_instances_hostError_real.json")
    doc["timestamp"] = "yesterday"
    ev = _parse(doc)
    assert ev.kind is EventKind.HOST_LOST and ev.occurred_at is None
    assert "timestamp" in ev.labels["parse.ignored"]


def test_deciding_field_of_the_wrong_type_dead_letters():
    """resourceName (the target) or methodName (the kind) of the wrong type: dead letter."""
    for path, value, reason in ((("protoPayload", "resourceName"), 7, "resourceName"),
                                (("protoPayload", "methodName"), ["x"], "methodName")):
        doc = load_fixture(PREEMPTED)
        doc[path[0]][path[1]] = value
        with pytest.raises(MalformedEvent) as info:
            _parse(doc)
        assert reason in info.value.reason
