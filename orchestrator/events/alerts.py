"""Cloud Monitoring alert notifications (the Pub/Sub / webhook notification-channel JSON).

Documented shape (schema "version": "1.2"): ``{"version": "1.2", "incident": {"incident_id",
"state": "open"|"closed", "started_at", "ended_at", "policy_name", "condition_name",
"resource": {"type", "labels"}, "metric": {"type", "labels"}, "metadata": {"system_labels",
"user_labels"}, "policy_user_labels", "summary", ...}}``. Opening an incident becomes
ALERT_FIRING, closing it ALERT_RESOLVED. The same incident state always yields the same event id,
so redeliveries dedupe while the later "closed" notification is a new event.

Labels: the user labels (``metadata.user_labels`` then ``policy_user_labels``, which win) are
kept under their own keys, so ``events.pubsub.filters`` and the ``job`` scope read them.

Targeting uses only the labels that name a host for the resource type (``TARGET_RULES``):
``gce_instance`` -> the metric's ``instance_name``, else the numeric ``instance_id``;
``tpu_worker`` -> slice ``node_id``, host ``worker_id``; ``k8s_node`` -> ``node_name``;
Kubernetes pod/container/cluster -> the ``cluster_name`` (job-wide for the job's own cluster);
``generic_task`` -> its ``job``. An uptime check's ``host`` or any other look-alike label is
never read as a host.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog

from orchestrator.events.fields import Fields
from orchestrator.events.model import Event, EventKind, MalformedEvent, Target, plausible_unix

log = structlog.get_logger(__name__)

SOURCE = "monitoring"
SUPPORTED_MAJOR = "1"
JOB_LABEL = "job"
SLICE_LABEL = "slice"
TARGET_RULES = {
    "gce_instance": "metric.labels.instance_name, else resource.labels.instance_id (id->name)",
    "tpu.googleapis.com/GceTpuWorker": "metric.labels.instance_name",
    "tpu_worker": "resource.labels.node_id (slice) + worker_id (host in the slice)",
    "k8s_node": "resource.labels.node_name (+ cluster_name)",
    "k8s_pod, k8s_container, k8s_cluster": "resource.labels.cluster_name: job-wide if ours",
    "generic_task": "resource.labels.job (job-wide)",
}


def is_alert_notification(payload: object) -> bool:
    """Cheap shape test used by the format dispatcher."""
    return isinstance(payload, Mapping) and "incident" in payload


def parse_alert_notification(
    payload: dict, *, now: float | None = None, source: str = SOURCE,
    require_target: bool = False,
) -> Event:
    """Turn one notification into ALERT_FIRING / ALERT_RESOLVED; raise MalformedEvent if not one.

    ``require_target``: the event intake's setting: an alert that names no host, slice, cluster
    or job cannot be tied to a run and is dead-lettered (autoresume finds its run otherwise).
    """
    if not isinstance(payload, Mapping):
        raise MalformedEvent(f"alert notification must be a JSON object, "
                             f"got {type(payload).__name__}")
    top = Fields(payload, "", snake=True)
    version = top.get("version")
    if version is not None and not isinstance(version, str):
        raise MalformedEvent("alert notification version must be a string such as \"1.2\"")
    if isinstance(version, str) and version.split(".", 1)[0] != SUPPORTED_MAJOR:
        raise MalformedEvent(f"unsupported alert notification version {version[:20]!r}",
                             fix="use a Cloud Monitoring notification channel with schema 1.x")
    if not isinstance(top.get("incident"), Mapping):
        raise MalformedEvent("alert notification has no `incident` object")
    inc = top.obj("incident")
    incident_id = inc.text("incident_id", required=True) or ""
    state = inc.text("state", required=True) or ""
    kind = {"open": EventKind.ALERT_FIRING, "closed": EventKind.ALERT_RESOLVED}.get(state.lower())
    if kind is None:
        raise MalformedEvent(f"incident.state must be open or closed, got {state[:40]!r}")

    resource = inc.obj("resource", strict=True)
    metric = inc.obj("metric")
    user_labels = {**inc.obj("metadata").labels("user_labels"), **inc.labels("policy_user_labels")}
    resource_type = resource.text("type") or ""
    target = _target(resource_type, resource.labels(), metric.labels(), user_labels)
    if require_target and target == Target():
        raise MalformedEvent(
            f"alert on resource type {resource_type[:60]!r} names no host, slice, cluster or "
            "job of a run",
            fix="group the alert by a label that names a host (docs/events.md, targeting) or "
                f"give the policy a user label {JOB_LABEL!r}")
    started = _time(inc, "started_at")
    ended = _time(inc, "ended_at")
    policy = inc.text("policy_name") or ""
    labels = {key: value for key, value in user_labels.items() if "." not in key}
    labels.update({"alert.policy_name": policy[:1024],
                   "alert.condition_name": (inc.text("condition_name") or "")[:1024],
                   "alert.resource_type": resource_type[:256]})
    summary = inc.text("summary") or f"{policy}: {inc.text('condition_name') or ''}"
    if inc.notes:
        labels["parse.ignored"] = "; ".join(inc.notes)[:1024]
        log.info("alert_fields_ignored", incident_id=incident_id[:80], notes=inc.notes)
    return Event(
        kind=kind, target=target, source=source, id=f"alert:{incident_id[:400]}:{state.lower()}",
        observed_at=time.time() if now is None else now, deadline=None,
        occurred_at=ended if kind is EventKind.ALERT_RESOLVED and ended else started,
        message=summary[:4096], labels=labels, raw=dict(payload),
    )


def _target(resource_type: str, resource: Mapping[str, str], metric: Mapping[str, str],
            user: Mapping[str, str]) -> Target:
    """Host/slice/cluster from the fields that name them for this resource type only."""
    job = user.get(JOB_LABEL) or None
    slice_name = user.get(SLICE_LABEL) or None
    host = host_kind = cluster = None
    if resource_type == "gce_instance":
        if metric.get("instance_name"):
            host, host_kind = metric["instance_name"], "instance"
        elif resource.get("instance_id"):
            host, host_kind = resource["instance_id"], "instance_id"
    elif resource_type == "tpu.googleapis.com/GceTpuWorker":
        if metric.get("instance_name"):
            host, host_kind = metric["instance_name"], "instance"
    elif resource_type == "tpu_worker":
        slice_name = resource.get("node_id") or slice_name
        if slice_name and resource.get("worker_id"):
            host, host_kind = resource["worker_id"], "tpu_worker"
    elif resource_type == "k8s_node":
        host, host_kind = resource.get("node_name") or None, "node_name"
        cluster = resource.get("cluster_name") or None
    elif resource_type in ("k8s_pod", "k8s_container", "k8s_cluster"):
        cluster = resource.get("cluster_name") or None
    elif resource_type == "generic_task":
        job = job or resource.get("job") or None
    return Target(job=job, slice=slice_name, host=host,
                  host_kind=host_kind if host else None, cluster=cluster)


def _time(inc: Fields, key: str) -> float | None:
    """Unix seconds (the channel sends integers; 0 or null when not set). Not deciding: a bad
    value is noted and dropped, never a dead letter."""
    value = inc.get(key)
    if value is None or value == 0:
        return None
    try:
        return plausible_unix(value, f"incident.{key}")
    except MalformedEvent as exc:
        inc.note(key, exc.reason.removeprefix(f"incident.{key}").strip())
        return None

