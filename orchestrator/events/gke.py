"""GKE Kubernetes events about nodes (``resource.type: k8s_node``, the core/v1 Event as
``jsonPayload`` in ``projects/P/logs/events``).

Reasons, from the kubelet and GKE's NodeTerminationHandler (the reasons GoogleCloudPlatform's
GKE maintenance dashboard reads, ``monitoring-dashboard-samples`` ``google-kubernetes-engine-ai``):

* ``NodeShutdown`` (graceful node shutdown: how a spot/preemptible node's termination reaches
  Kubernetes) -> preemption notice, ``events.notice_s`` from the entry's timestamp;
* ``TerminateOnHostMaintenance`` -> maintenance with the same notice;
* ``MaintenanceWindowScheduled`` / ``MaintenanceWindowRescheduled`` (and the pre-1.35
  ``NodeMaintenanceScheduled``) -> scheduled maintenance; the window comes from the Event's
  annotations ``maintenance.gke.io/maintenance-start-time`` / ``window-end-time``;
* ``MaintenanceWindowStarted`` / ``CustomerTriggeredMaintenance`` (pre-1.35
  ``MaintenanceStarted``) -> maintenance whose window has started;
* ``MaintenanceWindowCancelled`` / ``NoPendingMaintenance`` -> maintenance cancelled (noted);
* ``NodeNotReady`` / ``Rebooted`` -> unhealthy; ``RemovingNode`` / ``DeletingNode`` -> lost.

The host is the node: ``involvedObject.name``, else the resource's ``node_name`` (a GKE node is
named like its VM instance). ``cluster_name`` rides along, so a node of another cluster with the
same name is never taken for ours.
"""

from __future__ import annotations

from orchestrator.events.fields import Fields, build_event
from orchestrator.events.model import Event, EventKind, MalformedEvent, Target

START_ANNOTATION = "maintenance.gke.io/maintenance-start-time"
END_ANNOTATION = "maintenance.gke.io/window-end-time"

# reason -> (kind, how the deadline is set): "notice" = timestamp + notice_s, "window" = the
# annotated window start (required), "started" = the window start or the timestamp, None = none
GKE_REASONS: dict[str, tuple[EventKind, str | None]] = {
    "NodeNotReady": (EventKind.HOST_UNHEALTHY, None),
    "Rebooted": (EventKind.HOST_UNHEALTHY, None),
    "NodeShutdown": (EventKind.PREEMPTION_NOTICE, "notice"),
    "RemovingNode": (EventKind.HOST_LOST, None),
    "DeletingNode": (EventKind.HOST_LOST, None),
    "TerminateOnHostMaintenance": (EventKind.MAINTENANCE_SCHEDULED, "notice"),
    "MaintenanceWindowScheduled": (EventKind.MAINTENANCE_SCHEDULED, "window"),
    "MaintenanceWindowRescheduled": (EventKind.MAINTENANCE_SCHEDULED, "window"),
    "NodeMaintenanceScheduled": (EventKind.MAINTENANCE_SCHEDULED, "window"),
    "MaintenanceWindowStarted": (EventKind.MAINTENANCE_SCHEDULED, "started"),
    "MaintenanceStarted": (EventKind.MAINTENANCE_SCHEDULED, "started"),
    "CustomerTriggeredMaintenance": (EventKind.MAINTENANCE_SCHEDULED, "started"),
    "MaintenanceWindowCancelled": (EventKind.MAINTENANCE_CANCELLED, None),
    "NoPendingMaintenance": (EventKind.MAINTENANCE_CANCELLED, None),
}


def parse_node_event(entry: Fields, resource: Fields, *, now: float, notice_s: float,
                     source: str) -> Event:
    """One k8s_node LogEntry -> Event; MalformedEvent for unsupported reasons or no node."""
    payload = entry.obj("json_payload", strict=True)
    reason = payload.text("reason", strict=True)
    if not reason:
        raise MalformedEvent("jsonPayload.reason is missing from the GKE node event")
    if reason not in GKE_REASONS:
        raise MalformedEvent(f"unsupported GKE node event reason {reason[:80]!r}",
                             fix=f"route only reasons: {', '.join(sorted(GKE_REASONS))}")
    kind, timing = GKE_REASONS[reason]
    labels = resource.labels()
    node = payload.obj("involved_object", strict=True).text("name", strict=True) \
        or labels.get("node_name")
    if not node:
        raise MalformedEvent("GKE node event names no node (involvedObject.name or "
                             "resource.labels.node_name)")
    insert_id = entry.text("insert_id", strict=True)
    if not insert_id:
        raise MalformedEvent("log entry has no insertId")
    occurred = entry.time("timestamp", strict=timing in ("notice", "started"))
    annotations = payload.obj("metadata").labels("annotations")
    window: tuple[float | None, float | None] = (None, None)
    deadline = None
    if timing == "notice":
        deadline = (occurred if occurred is not None else now) + notice_s
    elif timing in ("window", "started"):
        window = _window(annotations, payload, required=timing == "window",
                         fallback=occurred if occurred is not None else now)
        deadline = window[0]
    extra = {"gke.reason": reason, "gke.cluster": labels.get("cluster_name", ""),
             "gke.location": labels.get("location", "")}
    for key in ("maintenance.gke.io/type", "maintenance.gke.io/status"):
        if annotations.get(key):
            extra[key.replace("maintenance.gke.io/", "maintenance.")] = annotations[key][:64]
    message = payload.text("message") or reason
    return build_event(
        kind=kind, target=Target(host=node[:256], host_kind="node_name",
                                 cluster=labels.get("cluster_name") or None),
        key=f"gke:{insert_id[:300]}", occurred=occurred, now=now, deadline=deadline,
        message=message, source=source, labels=extra, raw=entry.data, notes=entry.notes,
        window=window)


def _window(annotations: dict[str, str], payload: Fields, *, required: bool,
            fallback: float) -> tuple[float | None, float | None]:
    """(start, end) from the maintenance annotations; the start decides the drain, so a
    scheduled window without one is dead-lettered, a started one falls back to the timestamp."""
    holder = Fields(annotations, f"{payload.where}.metadata.annotations", payload.notes)
    start = holder.time(START_ANNOTATION, strict=True)
    if start is None:
        if required:
            raise MalformedEvent(f"GKE maintenance event has no {START_ANNOTATION} annotation",
                                 fix="route the event as GKE writes it (GKE 1.35+ annotates "
                                     "the window)")
        start = fallback
    end = holder.time(END_ANNOTATION)
    if end is not None and end < start:
        holder.note(END_ANNOTATION, "is before the window start")
        end = None
    return start, end
