"""Cloud Logging entries routed to Pub/Sub by a log sink: GCE system events and GKE node events.

A sink publishes the LogEntry JSON itself as the message data. We accept:

* GCE audit system events (``logName`` ``.../cloudaudit.googleapis.com%2Fsystem_event``,
  ``protoPayload.methodName``): ``compute.instances.preempted`` (a preemption notice: the VM has
  the platform's notice period, ~30 s, from the entry's timestamp),
  ``compute.instances.{terminate,shutdown}OnHostMaintenance`` (maintenance that stops the VM,
  same notice), ``compute.instances.migrateOnHostMaintenance`` (live migration: informational,
  no deadline) and ``compute.instances.hostError`` (the VM was terminated: host lost).
* GKE Kubernetes events about nodes (``resource.type == "k8s_node"``, the Event object as
  ``jsonPayload``): ``NodeNotReady``/``Rebooted`` (unhealthy), ``NodeShutdown`` (graceful node
  shutdown, which is how a spot node's preemption reaches Kubernetes: a notice),
  ``RemovingNode``/``DeletingNode`` (lost).

Anything else raises MalformedEvent with the method / reason, so a too-wide sink filter shows up
in the dead letters instead of vanishing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.events.model import Event, EventKind, MalformedEvent, Target
from orchestrator.events.timefmt import parse_rfc3339

SOURCE = "logging"
DEFAULT_NOTICE_S = 30.0

# method -> (kind, has a notice deadline)
GCE_METHODS: dict[str, tuple[EventKind, bool]] = {
    "compute.instances.preempted": (EventKind.PREEMPTION_NOTICE, True),
    "compute.instances.terminateOnHostMaintenance": (EventKind.MAINTENANCE_SCHEDULED, True),
    "compute.instances.shutdownOnHostMaintenance": (EventKind.MAINTENANCE_SCHEDULED, True),
    "compute.instances.migrateOnHostMaintenance": (EventKind.MAINTENANCE_SCHEDULED, False),
    "compute.instances.hostError": (EventKind.HOST_LOST, False),
}
GKE_REASONS: dict[str, tuple[EventKind, bool]] = {
    "NodeNotReady": (EventKind.HOST_UNHEALTHY, False),
    "Rebooted": (EventKind.HOST_UNHEALTHY, False),
    "NodeShutdown": (EventKind.PREEMPTION_NOTICE, True),
    "RemovingNode": (EventKind.HOST_LOST, False),
    "DeletingNode": (EventKind.HOST_LOST, False),
}


def is_log_entry(payload: object) -> bool:
    """Cheap shape test: a LogEntry always has logName or one of the payload fields."""
    return isinstance(payload, Mapping) and any(
        key in payload for key in ("logName", "protoPayload", "jsonPayload")
    )


def parse_log_entry(
    entry: Mapping[str, Any], *, now: float, notice_s: float = DEFAULT_NOTICE_S,
    source: str = SOURCE,
) -> Event:
    """One LogEntry -> Event, or MalformedEvent naming what is unsupported or broken."""
    if not isinstance(entry, Mapping):
        raise MalformedEvent("log entry must be a JSON object")
    resource = _obj(entry, "resource", "resource")
    resource_type = resource.get("type")
    timestamp = entry.get("timestamp")
    occurred = parse_rfc3339(timestamp, "timestamp") if timestamp is not None else None
    if "protoPayload" in entry:
        return _gce_system_event(entry, resource, occurred, now, notice_s, source)
    if resource_type == "k8s_node" and "jsonPayload" in entry:
        return _gke_node_event(entry, resource, occurred, now, notice_s, source)
    raise MalformedEvent(
        f"unsupported log entry (resource.type={str(resource_type)[:40]!r})",
        fix="route only GCE system events and GKE k8s_node events to the subscription "
            "(see docs/events.md for the sink filter)",
    )


def _gce_system_event(entry, resource, occurred, now, notice_s, source) -> Event:
    proto = _obj(entry, "protoPayload", "protoPayload")
    method = proto.get("methodName")
    if not isinstance(method, str) or not method:
        operation = entry.get("operation")
        method = operation.get("producer") if isinstance(operation, Mapping) else None
    if not isinstance(method, str) or not method:
        raise MalformedEvent("protoPayload.methodName is missing")
    if method not in GCE_METHODS:
        raise MalformedEvent(f"unsupported GCE system event {method[:80]!r}",
                             fix=f"route only: {', '.join(sorted(GCE_METHODS))}")
    kind, has_deadline = GCE_METHODS[method]
    instance = _instance_from_resource_name(proto.get("resourceName"))
    labels = _labels(resource)
    host = instance or labels.get("instance_id")
    if not host:
        raise MalformedEvent("GCE system event names no instance (protoPayload.resourceName)")
    operation = entry.get("operation")
    op_id = operation.get("id") if isinstance(operation, Mapping) else None
    insert_id = entry.get("insertId")
    key = op_id if isinstance(op_id, str) and op_id else insert_id
    if not isinstance(key, str) or not key:
        raise MalformedEvent("log entry has neither operation.id nor insertId")
    status = proto.get("status")
    message = status.get("message") if isinstance(status, Mapping) else None
    return _event(
        kind=kind, host=host, key=f"gce:{key[:300]}:{method}", occurred=occurred, now=now,
        deadline=(occurred if occurred is not None else now) + notice_s if has_deadline else None,
        message=message if isinstance(message, str) else method, source=source,
        labels={"gce.method": method, "gce.instance_id": labels.get("instance_id", ""),
                "gce.zone": labels.get("zone", "")},
        raw=entry,
    )


def _gke_node_event(entry, resource, occurred, now, notice_s, source) -> Event:
    payload = _obj(entry, "jsonPayload", "jsonPayload")
    reason = payload.get("reason")
    if not isinstance(reason, str) or not reason:
        raise MalformedEvent("jsonPayload.reason is missing from the GKE node event")
    if reason not in GKE_REASONS:
        raise MalformedEvent(f"unsupported GKE node event reason {reason[:80]!r}",
                             fix=f"route only reasons: {', '.join(sorted(GKE_REASONS))}")
    kind, has_deadline = GKE_REASONS[reason]
    involved = payload.get("involvedObject")
    node = involved.get("name") if isinstance(involved, Mapping) else None
    labels = _labels(resource)
    node = node if isinstance(node, str) and node else labels.get("node_name")
    if not node:
        raise MalformedEvent("GKE node event names no node (involvedObject.name)")
    insert_id = entry.get("insertId")
    if not isinstance(insert_id, str) or not insert_id:
        raise MalformedEvent("log entry has no insertId")
    message = payload.get("message")
    return _event(
        kind=kind, host=node, key=f"gke:{insert_id[:300]}", occurred=occurred, now=now,
        deadline=(occurred if occurred is not None else now) + notice_s if has_deadline else None,
        message=message if isinstance(message, str) else reason, source=source,
        labels={"gke.reason": reason, "gke.cluster": labels.get("cluster_name", ""),
                "gke.location": labels.get("location", "")},
        raw=entry,
    )


def _event(*, kind, host, key, occurred, now, deadline, message, source, labels, raw) -> Event:
    return Event(kind=kind, target=Target(host=host[:256]), source=source, id=key,
                 observed_at=now, deadline=deadline, occurred_at=occurred,
                 message=message[:4096], labels=labels, raw=dict(raw))


def _instance_from_resource_name(name: object) -> str | None:
    """``projects/P/zones/Z/instances/NAME`` -> NAME."""
    if not isinstance(name, str):
        return None
    parts = name.split("/")
    if len(parts) >= 2 and parts[-2] == "instances" and parts[-1]:
        return parts[-1]
    return None


def _obj(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedEvent(f"{where} must be an object")
    return value


def _labels(resource: Mapping[str, Any]) -> dict[str, str]:
    labels = resource.get("labels")
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): v for k, v in labels.items() if isinstance(v, str)}
