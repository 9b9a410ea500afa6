"""Cloud Monitoring alert notifications (the Pub/Sub / webhook notification-channel JSON).

Documented shape (schema "version": "1.2"): ``{"version": "1.2", "incident": {"incident_id",
"state": "open"|"closed", "started_at", "ended_at", "policy_name", "condition_name",
"resource": {"type", "labels"}, "metric": {"type", "labels"}, "metadata": {"system_labels",
"user_labels"}, "policy_user_labels", "summary", ...}}``. Opening an incident becomes
ALERT_FIRING, closing it ALERT_RESOLVED. The same incident state always yields the same event id,
so redeliveries dedupe while the later "closed" notification is a new event.

Targeting: the job comes from a ``job`` user label (policy or metadata); the host from the
instance name the metric or resource names; the slice from a ``slice`` user label or, for Cloud
TPU's ``tpu_worker`` resource, its ``node_id`` (a TPU node is one slice).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from orchestrator.events.model import Event, EventKind, MalformedEvent, Target, parse_labels

SOURCE = "monitoring"
SUPPORTED_MAJOR = "1"
JOB_LABEL = "job"
SLICE_LABEL = "slice"
_HOST_LABELS = ("instance_name", "node_name", "host", "instance")


def is_alert_notification(payload: object) -> bool:
    """Cheap shape test used by the format dispatcher."""
    return isinstance(payload, Mapping) and "incident" in payload


def parse_alert_notification(
    payload: dict, *, now: float | None = None, source: str = SOURCE
) -> Event:
    """Turn one notification into ALERT_FIRING / ALERT_RESOLVED; raise MalformedEvent if not one.

    ``now`` is the observation time (defaults to the wall clock); nothing else is read from the
    environment, so the function is safe to call on untrusted input.
    """
    if not isinstance(payload, Mapping):
        raise MalformedEvent(f"alert notification must be a JSON object, "
                             f"got {type(payload).__name__}")
    version = payload.get("version")
    if version is not None and not isinstance(version, str):
        raise MalformedEvent("alert notification version must be a string such as \"1.2\"")
    if isinstance(version, str) and version.split(".", 1)[0] != SUPPORTED_MAJOR:
        raise MalformedEvent(f"unsupported alert notification version {version[:20]!r}",
                             fix="use a Cloud Monitoring notification channel with schema 1.x")
    incident = payload.get("incident")
    if not isinstance(incident, Mapping):
        raise MalformedEvent("alert notification has no `incident` object")
    incident_id = _str(incident, "incident_id", required=True)
    state = _str(incident, "state", required=True, allow_int=False).lower()
    if state == "open":
        kind = EventKind.ALERT_FIRING
    elif state == "closed":
        kind = EventKind.ALERT_RESOLVED
    else:
        raise MalformedEvent(f"incident.state must be open or closed, got {state[:40]!r}")

    resource = _obj(incident, "resource")
    metric = _obj(incident, "metric")
    metadata = _obj(incident, "metadata")
    resource_labels = parse_labels(resource.get("labels"), "incident.resource.labels")
    metric_labels = parse_labels(metric.get("labels"), "incident.metric.labels")
    user_labels = {
        **parse_labels(metadata.get("user_labels"), "incident.metadata.user_labels"),
        **parse_labels(incident.get("policy_user_labels"), "incident.policy_user_labels"),
    }
    resource_type = _str(resource, "type") or ""

    host = _first(metric_labels, _HOST_LABELS) or _first(resource_labels, _HOST_LABELS)
    slice_name = user_labels.get(SLICE_LABEL)
    if slice_name is None and resource_type == "tpu_worker":
        slice_name = resource_labels.get("node_id")
    started = _time(incident, "started_at")
    ended = _time(incident, "ended_at")
    policy = _str(incident, "policy_name") or ""
    condition = _str(incident, "condition_name") or ""
    summary = _str(incident, "summary") or ""

    labels = {f"alert.{k}": v for k, v in user_labels.items()}
    labels.update({
        "alert.policy_name": policy[:1024],
        "alert.condition_name": condition[:1024],
        "alert.resource_type": resource_type[:256],
    })
    if JOB_LABEL in user_labels:
        labels[JOB_LABEL] = user_labels[JOB_LABEL]
    return Event(
        kind=kind,
        target=Target(job=user_labels.get(JOB_LABEL) or None, slice=slice_name or None,
                      host=host or None),
        source=source,
        id=f"alert:{incident_id[:400]}:{state}",
        observed_at=time.time() if now is None else now,
        deadline=None,
        occurred_at=ended if kind is EventKind.ALERT_RESOLVED and ended else started,
        message=(summary or f"{policy}: {condition}")[:4096],
        labels=labels,
        raw=dict(payload),
    )


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedEvent(f"incident.{key} must be an object")
    return value


def _str(
    parent: Mapping[str, Any], key: str, *, required: bool = False, allow_int: bool = True
) -> str | None:
    value = parent.get(key)
    if value is None or value == "":
        if required:
            raise MalformedEvent(f"incident.{key} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int) if allow_int else str):
        raise MalformedEvent(f"incident.{key} must be a string")
    return str(value)


def _time(parent: Mapping[str, Any], key: str) -> float | None:
    """Unix seconds; the channel sends integers (0 or null when not set)."""
    value = parent.get(key)
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedEvent(f"incident.{key} must be unix seconds")
    try:
        number = float(value)
    except OverflowError:
        raise MalformedEvent(f"incident.{key} is out of range") from None
    if not math.isfinite(number) or number < 0:
        raise MalformedEvent(f"incident.{key} is not a valid time")
    return number


def _first(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if labels.get(key):
            return labels[key]
    return None
