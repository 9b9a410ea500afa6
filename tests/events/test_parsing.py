"""Parsing every accepted format from real-shaped samples, and rejecting the rest with a reason."""

from __future__ import annotations

import base64
import json

import pytest

from orchestrator.events.logentries import parse_log_entry
from orchestrator.events.model import Event, EventKind, MalformedEvent, Target
from orchestrator.events.parsing import detect_format, parse_bytes, parse_value
from orchestrator.events.timefmt import parse_rfc3339
from tests.events.conftest import load_fixture

NOW = 1_800_000_000.0


def _bytes(name: str) -> bytes:
    return json.dumps(load_fixture(name)).encode()


def test_gce_preempted_entry_is_a_preemption_notice_with_platform_deadline():
    """The real preempted system event targets the instance; deadline = timestamp + 30 s."""
    event = parse_bytes(_bytes("logentry_gce_compute_instances_preempted_real_gcpdiag.json"),
                        now=NOW, source="pubsub")
    assert event.kind is EventKind.PREEMPTION_NOTICE
    assert event.target == Target(host="spot-vm-termination", host_kind="instance")
    assert event.occurred_at == pytest.approx(parse_rfc3339("2025-03-17T06:00:14.413235Z", "t"))
    assert event.deadline == pytest.approx(event.occurred_at + 30.0)
    assert event.id == ("gce:systemevent-1742191214262-630838074f9b5-9fa4f9d5-b984944c:"
                        "compute.instances.preempted")
    assert event.labels["gce.zone"] == "us-central1-c"


@pytest.mark.parametrize(
    ("name", "kind", "has_deadline"),
    [
        ("logentry_gce_compute_instances_hostError_real.json", EventKind.HOST_LOST, False),
        ("logentry_gce_compute_instances_migrateOnHostMaintenance_ASSEMBLED.json",
         EventKind.LIVE_MIGRATION, False),
        ("logentry_gce_compute_instances_terminateOnHostMaintenance_ASSEMBLED.json",
         EventKind.MAINTENANCE_SCHEDULED, True),
        ("logentry_gke_node_NodeNotReady_ASSEMBLED.json", EventKind.HOST_UNHEALTHY, False),
        ("logentry_gke_node_NodeShutdown_ASSEMBLED.json", EventKind.PREEMPTION_NOTICE, True),
    ],
)
def test_log_entries_map_to_kinds(name, kind, has_deadline):
    """Each supported system/node event maps to its kind, deadline only for notices."""
    event = parse_bytes(_bytes(name), now=NOW, source="pubsub")
    assert event.kind is kind
    assert (event.deadline is not None) is has_deadline
    assert event.target.host


def test_shutdown_on_host_maintenance_is_tolerated_like_terminate():
    """Google's sources disagree on TERMINATE vs SHUTDOWN; both are maintenance notices."""
    entry = load_fixture("logentry_gce_compute_instances_terminateOnHostMaintenance_ASSEMBLED.json")
    entry["protoPayload"]["methodName"] = "compute.instances.shutdownOnHostMaintenance"
    assert parse_log_entry(entry, now=NOW).kind is EventKind.MAINTENANCE_SCHEDULED


def test_gke_node_event_targets_the_node_name():
    """A GKE node name is the GCE instance name, which HostRef.matches knows."""
    event = parse_value(load_fixture("logentry_gke_node_NodeNotReady_ASSEMBLED.json"), now=NOW,
                        source="pubsub")
    assert event.target.host == "gke-tpu-pool-4c2d9a1e-0"
    assert event.labels["gke.cluster"] == "tpu-cluster"


def test_push_envelope_is_unwrapped():
    """A push body carries the LogEntry base64-encoded; it parses like the entry itself."""
    inner = parse_value(load_fixture("logentry_gce_compute_instances_preempted_real_gcpdiag.json"),
                        now=NOW, source="x")
    push = "pubsub_push_body_logsink_compute_instances_preempted_ASSEMBLED.json"
    outer = parse_bytes(_bytes(push), now=NOW, source="x")
    assert outer.id == inner.id and outer.kind is inner.kind


def test_compute_operation_is_rejected_with_a_fix():
    """Operations are not what a log sink sends: dead letter naming the right route."""
    with pytest.raises(MalformedEvent) as info:
        parse_bytes(_bytes("compute_operation_preempted_real_gcpdiag.json"), now=NOW, source="x")
    assert "Operation" in info.value.reason and "log sink" in info.value.fix


def test_own_event_roundtrip():
    """to_json -> bytes -> parse gives the same event."""
    event = Event(kind=EventKind.OPERATOR_DRAIN, target=Target(job="j", slice="s", host="3"),
                  source="cli", id="e-1", observed_at=NOW, deadline=NOW + 5, incarnation=2,
                  message="drain", labels={"a": "b"})
    assert parse_bytes(json.dumps(event.to_json()).encode(), now=0, source="x") == event


def test_kind_aliases_and_int_host():
    """The CLI's short kinds and an integer host index are accepted."""
    event = parse_value({"schema_version": 1, "id": "x", "kind": "preemption",
                         "target": {"host": 1}}, now=NOW, source="x")
    assert event.kind is EventKind.PREEMPTION_NOTICE
    assert event.target.host == "1"
    assert event.observed_at == NOW


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b"\"text\"", "JSON object"),
        (b"{}", "unknown payload format"),
        (b"{\"schema_version\": 2, \"id\": \"a\", \"kind\": \"stop\"}", "schema_version"),
        (b"{\"schema_version\": 1, \"id\": \"a\", \"kind\": \"explode\"}", "unknown kind"),
        (b"{\"schema_version\": 1, \"kind\": \"stop\"}", "id is missing"),
        (b"{\"schema_version\": 1, \"id\": 5, \"kind\": \"stop\"}", "id must be"),
        (b"{\"schema_version\": 1, \"id\": \"a\", \"kind\": \"stop\", \"deadline\": \"soon\"}",
         "deadline"),
        (b"{\"schema_version\": 1, \"id\": \"a\", \"kind\": \"stop\", \"deadline\": 1e400}",
         "deadline"),
        (b"{\"schema_version\": 1, \"id\": \"a\", \"kind\": \"stop\", \"extra\": 1}",
         "unknown field"),
        (b"{\"schema_version\": 1, \"id\": \"a\", \"kind\": \"stop\", \"target\": [1]}", "target"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
        (b"{\"logName\": \"x\", \"protoPayload\": {\"methodName\": \"compute.instances.insert\"}}",
         "unsupported GCE system event"),
        (b"{\"logName\": \"x\", \"textPayload\": \"hello\"}", "unsupported log entry"),
        (b"{\"message\": {\"data\": \"!!!\"}, \"subscription\": \"s\"}", "base64"),
    ],
)
def test_malformed_payloads_have_reasons(payload, reason):
    """Each kind of bad input raises MalformedEvent naming the problem."""
    with pytest.raises(MalformedEvent) as info:
        parse_bytes(payload, now=NOW, source="x")
    assert reason in info.value.reason


def test_oversized_payload_is_rejected_before_decoding():
    """A payload over the limit is a dead letter, not a memory problem."""
    with pytest.raises(MalformedEvent, match="over the"):
        parse_bytes(b" " * 2000, now=NOW, source="x", max_bytes=1000)


def test_nested_push_envelopes_are_not_unwrapped_twice():
    """One envelope level only: a push body inside a push body is unknown."""
    inner = {"message": {"data": base64.b64encode(b"{}").decode()}, "subscription": "s"}
    outer = {"message": {"data": base64.b64encode(json.dumps(inner).encode()).decode()},
             "subscription": "s"}
    with pytest.raises(MalformedEvent):
        parse_value(outer, now=NOW, source="x")


def test_detect_format_names():
    """The dispatcher's view of each fixture."""
    assert detect_format(load_fixture("monitoring_alert_incident_open.json")) == "monitoring-alert"
    assert detect_format(load_fixture("logentry_gce_compute_instances_hostError_real.json")) == (
        "log-entry")
    assert detect_format({"schema_version": 1}) == "event"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2022-06-30T14:07:23.983450844Z", 1656598043.983450844),
        ("2025-02-02T11:47:13.000-08:00", 1738525633.0),
        ("2025-03-17T06:00:14Z", 1742191214.0),
    ],
)
def test_rfc3339(text, expected):
    """Nanoseconds and offsets as Cloud Logging / Compute write them."""
    assert parse_rfc3339(text, "t") == pytest.approx(expected, abs=1e-6)
