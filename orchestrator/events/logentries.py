"""Cloud Logging entries routed to Pub/Sub by a log sink: GCE system events (this module) and GKE
node events (``gke.py``).

A sink publishes the LogEntry JSON itself as the message data. GCE audit system events
(``logName .../cloudaudit.googleapis.com%2Fsystem_event``) are read from
``protoPayload.methodName``; the method names are Compute Engine's interruption reasons (as
listed by GoogleCloudPlatform/ml-auto-solutions ``interruption_validation_dag.py``):

* ``preempted``, ``baremetalCaretakerPreempted`` -> preemption notice (the platform's notice
  period, ``events.notice_s``, from the entry's timestamp);
* ``terminateOnHostMaintenance`` / ``shutdownOnHostMaintenance`` -> maintenance with that notice;
* ``upcomingMaintenance`` -> scheduled maintenance carrying its window
  (``protoPayload.metadata.windowStartTime/windowEndTime``, ``maintenanceStatus``,
  ``canReschedule``): the earliest warning Google gives, days ahead;
* ``migrateOnHostMaintenance`` -> live migration: noted, the VM keeps running;
* ``hostError`` and the other interruptions that stop the VM -> host lost.

The host is the instance ``protoPayload.resourceName`` names (``projects/P/zones/Z/instances/N``),
else the ``gce_instance`` resource's numeric ``instance_id`` (resolved through the id -> name map
the hosts read from their metadata servers). An entry that names no instance (a reservation
block, say) cannot be tied to a host and is dead-lettered with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.events.fields import Fields, build_event
from orchestrator.events.model import Event, EventKind, MalformedEvent, Target

SOURCE = "logging"
DEFAULT_NOTICE_S = 30.0
PREFIX = "compute.instances."

# method (after "compute.instances.") -> (kind, notice deadline from the entry's timestamp)
GCE_METHODS: dict[str, tuple[EventKind, bool]] = {
    "preempted": (EventKind.PREEMPTION_NOTICE, True),
    "baremetalCaretakerPreempted": (EventKind.PREEMPTION_NOTICE, True),
    "terminateOnHostMaintenance": (EventKind.MAINTENANCE_SCHEDULED, True),
    "shutdownOnHostMaintenance": (EventKind.MAINTENANCE_SCHEDULED, True),
    "upcomingMaintenance": (EventKind.MAINTENANCE_SCHEDULED, False),  # deadline = window start
    "migrateOnHostMaintenance": (EventKind.LIVE_MIGRATION, False),
    "hostError": (EventKind.HOST_LOST, False),
    "guestTerminate": (EventKind.HOST_LOST, False),
    "instanceManagerHaltForRestart": (EventKind.HOST_LOST, False),
    "stoppedDueToPdDoubleServe": (EventKind.HOST_LOST, False),
    "kmsKeyError": (EventKind.HOST_LOST, False),
    "shredmillKeyError": (EventKind.HOST_LOST, False),
    "invalidVmImage": (EventKind.HOST_LOST, False),
    "scratchDiskCreationFailed": (EventKind.HOST_LOST, False),
    "localSsdInitializationError": (EventKind.HOST_LOST, False),
    "localSsdInitializationKeyError": (EventKind.HOST_LOST, False),
    "localSsdVerifyTarError": (EventKind.HOST_LOST, False),
    "localSsdRecoveryFailedError": (EventKind.HOST_LOST, False),
    "localSsdRecoveryTimeoutError": (EventKind.HOST_LOST, False),
    "localSsdRecoveryAttempting": (EventKind.HOST_UNHEALTHY, False),
}


def is_log_entry(payload: object) -> bool:
    """Cheap shape test: a LogEntry has logName or a payload field (either spelling)."""
    return isinstance(payload, Mapping) and any(
        key in payload for key in ("logName", "log_name", "protoPayload", "proto_payload",
                                   "jsonPayload", "json_payload"))


def parse_log_entry(
    entry: Mapping[str, Any], *, now: float, notice_s: float = DEFAULT_NOTICE_S,
    source: str = SOURCE,
) -> Event:
    """One LogEntry -> Event, or MalformedEvent naming what is unsupported or broken."""
    if not isinstance(entry, Mapping):
        raise MalformedEvent("log entry must be a JSON object")
    fields = Fields(entry, "")
    resource = fields.obj("resource", strict=True)
    resource_type = resource.text("type")
    if fields.has("proto_payload"):
        return _gce_system_event(fields, resource, now, notice_s, source)
    if resource_type == "k8s_node" and fields.has("json_payload"):
        from orchestrator.events.gke import parse_node_event

        return parse_node_event(fields, resource, now=now, notice_s=notice_s, source=source)
    raise MalformedEvent(
        f"unsupported log entry (resource.type={str(resource_type)[:40]!r})",
        fix="route only GCE system events and GKE k8s_node events to the subscription "
            "(see docs/events.md for the sink filter)",
    )


def _gce_system_event(entry: Fields, resource: Fields, now: float, notice_s: float,
                      source: str) -> Event:
    proto = entry.obj("proto_payload", strict=True)
    operation = entry.obj("operation")
    method = proto.text("method_name", strict=True, numbers=False) \
        or operation.text("producer", numbers=False)
    if not method:
        raise MalformedEvent("protoPayload.methodName is missing")
    short = method.removeprefix(PREFIX)
    if not method.startswith(PREFIX) or short not in GCE_METHODS:
        raise MalformedEvent(f"unsupported GCE system event {method[:80]!r}",
                             fix="route only: " + ", ".join(PREFIX + m for m in GCE_METHODS))
    kind, notice = GCE_METHODS[short]
    labels = resource.labels()
    target = _instance_target(proto.text("resource_name", strict=True, numbers=False),
                              resource.text("type"), labels)
    key = operation.text("id") or entry.text("insert_id", strict=True)
    if not key:
        raise MalformedEvent("log entry has neither operation.id nor insertId")
    occurred = entry.time("timestamp", strict=notice)
    status = proto.obj("status").text("message")
    extra: dict[str, str] = {"gce.method": method, "gce.instance_id": labels.get("instance_id", ""),
                             "gce.zone": labels.get("zone", "")}
    window: tuple[float | None, float | None] = (None, None)
    deadline = (occurred if occurred is not None else now) + notice_s if notice else None
    if short == "upcomingMaintenance":
        window, extra_m = _upcoming_window(proto.obj("metadata", strict=True))
        extra.update(extra_m)
        deadline = window[0]
        key = f"{key}:{extra_m.get('maintenance.window_start_time', '')}"
    return build_event(
        kind=kind, target=target, key=f"gce:{key[:300]}:{method}", occurred=occurred, now=now,
        deadline=deadline, message=status or method, source=source, labels=extra, raw=entry.data,
        notes=entry.notes, window=window)


def _upcoming_window(meta: Fields) -> tuple[tuple[float | None, float | None], dict[str, str]]:
    """The maintenance window of an ``upcomingMaintenance`` entry; its start decides when the
    drain must be done, so it is required and strict; the rest is informational."""
    raw_start = meta.get("window_start_time")
    start = meta.time("window_start_time", strict=True)
    if start is None:
        raise MalformedEvent("upcomingMaintenance has no protoPayload.metadata.windowStartTime",
                             fix="route the system event as Compute Engine writes it")
    end = meta.time("window_end_time")
    if end is not None and end < start:
        meta.note("window_end_time", "is before windowStartTime")
        end = None
    extra = {"maintenance.window_start_time": str(raw_start)[:64]}
    for name, label in (("maintenance_status", "maintenance.status"), ("type", "maintenance.type"),
                        ("latest_window_start_time", "maintenance.latest_window_start_time")):
        value = meta.text(name)
        if value:
            extra[label] = value[:64]
    can = meta.flag("can_reschedule")
    if can is not None:
        extra["maintenance.can_reschedule"] = "true" if can else "false"
    return (start, end), extra


def _instance_target(resource_name: str | None, resource_type: str | None,
                     labels: Mapping[str, str]) -> Target:
    """Only fields that name an instance: the resourceName's instance, else the gce_instance
    resource's numeric id. Anything else is dead-lettered with what it did name."""
    instance = instance_from_resource_name(resource_name)
    if instance:
        return Target(host=instance[:256], host_kind="instance")
    if resource_type == "gce_instance" and labels.get("instance_id"):
        return Target(host=labels["instance_id"][:256], host_kind="instance_id")
    raise MalformedEvent(
        f"GCE system event names no instance (resourceName={str(resource_name)[:120]!r}, "
        f"resource.type={str(resource_type)[:40]!r})",
        fix="only events about VM instances can be tied to a host of the run; route "
            "reservation-level events elsewhere")


def instance_from_resource_name(name: object) -> str | None:
    """``projects/P/zones/Z/instances/NAME`` (or a full URL of it) -> NAME."""
    if not isinstance(name, str):
        return None
    parts = name.rstrip("/").split("/")
    if len(parts) >= 2 and parts[-2] == "instances" and parts[-1]:
        return parts[-1]
    return None

