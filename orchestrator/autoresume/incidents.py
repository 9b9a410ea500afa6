"""From a Cloud Monitoring notification to the policy's ``Incident``.

Parsing and validation are the event intake's (``orchestrator.events.alerts``); this adds the two
things autoresume needs that the generic event does not carry, read from the notification:

* the run: the labels of the time series that fired, ``incident.resource.labels.job`` (the
  ``generic_task`` job the metric exporter writes, = the run id) and/or
  ``incident.metric.labels.run_id``; when both are present they must agree. A policy's user
  labels never name a run (they are the same for every series of the policy), and an incident
  with neither label is refused;
* its origin: the scoping project, the metric type prefix and the policy user labels must match
  the service's ``origin`` config, so an alert policy someone else wrote cannot resume runs;
* the kind: the alert policy's ``kind`` user label (deploy/terraform sets it), else a guess from
  the metric type (``.../heartbeat`` -> heartbeat_absent, ``.../mfu`` -> mfu_low,
  ``.../loss`` -> loss_not_finite).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.events.alerts import parse_alert_notification
from orchestrator.events.model import Event, EventKind, MalformedEvent
from policies.autoresume import Incident, IncidentKind, IncidentState

KIND_LABEL = "kind"
_METRIC_KINDS = {
    "heartbeat": IncidentKind.HEARTBEAT_ABSENT,
    "mfu": IncidentKind.MFU_LOW,
    "loss": IncidentKind.LOSS_NOT_FINITE,
    "step_time": IncidentKind.STEP_STALLED,
}


def _labels(obj: object, key: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        return {}
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def check_origin(inc: Mapping[str, Any], *, project: str, metric_prefix: str,
                 user_labels: Mapping[str, str]) -> None:
    """Raise ``MalformedEvent`` unless the incident comes from our project, metric and policy."""
    scoping = inc.get("scoping_project_id")
    if project and scoping != project:
        raise MalformedEvent(
            f"incident from project {str(scoping)[:100]!r}, not {project!r}",
            fix="set origin.project to the project whose alert policies notify this topic")
    metric = inc.get("metric") if isinstance(inc.get("metric"), Mapping) else {}
    mtype = metric.get("type")
    prefix = metric_prefix.rstrip("/") + "/"
    if metric_prefix and not (isinstance(mtype, str) and mtype.startswith(prefix)):
        raise MalformedEvent(
            f"incident metric {str(mtype)[:200]!r} is not under {prefix!r}",
            fix="alert only on the orchestrator's metrics, or set origin.metric_prefix")
    labels = _labels(inc, "policy_user_labels")
    for key, want in user_labels.items():
        if labels.get(key) != want:
            raise MalformedEvent(
                f"alert policy user label {key}={str(labels.get(key))[:100]!r}, expected "
                f"{want!r}", fix="label the alert policy (deploy/terraform/monitoring.tf does) "
                "or set origin.user_labels")


def incident_from_notification(
    payload: object, *, now: float, origin: Mapping[str, Any] | None = None
) -> tuple[Incident, Event]:
    """Validate and convert; raise ``MalformedEvent`` (reason for the dead letter) otherwise.

    ``origin`` (project, metric_prefix, user_labels) is checked when given.
    """
    if not isinstance(payload, dict):
        raise MalformedEvent(f"alert notification must be a JSON object, got "
                             f"{type(payload).__name__}")
    event = parse_alert_notification(payload, now=now)
    inc = payload["incident"]
    metric = inc.get("metric") if isinstance(inc.get("metric"), Mapping) else {}
    resource = inc.get("resource") if isinstance(inc.get("resource"), Mapping) else {}
    metric_labels = _labels(metric, "labels")
    resource_labels = _labels(resource, "labels")
    user_labels = {**_labels(_labels(inc, "metadata"), "user_labels"),
                   **_labels(inc, "policy_user_labels")}
    if origin is not None:
        check_origin(inc, **origin)

    by_metric = _text(metric_labels.get("run_id"))
    by_resource = _text(resource_labels.get("job"))
    if by_metric and by_resource and by_metric != by_resource:
        raise MalformedEvent(
            f"the incident names two runs: metric label run_id={by_metric[:100]!r}, resource "
            f"label job={by_resource[:100]!r}",
            fix="export the run id as the generic_task job (run.name is the run id)")
    run_id = by_metric or by_resource
    if run_id is None:
        raise MalformedEvent(
            "the incident names no run: the series that fired has no resource label job or "
            "metric label run_id (policy user labels do not name a run)",
            fix="group the alert condition by resource.label.job / metric.label.run_id "
                "(deploy/terraform/monitoring.tf does)",
        )
    kind_text = _text(user_labels.get(KIND_LABEL))
    if kind_text is not None:
        try:
            kind = IncidentKind(kind_text.strip().lower())
        except ValueError:
            kind = IncidentKind.UNKNOWN
    else:
        metric_type = _text(metric.get("type")) or ""
        kind = _METRIC_KINDS.get(metric_type.rsplit("/", 1)[-1], IncidentKind.UNKNOWN)
    state = IncidentState.OPEN if event.kind is EventKind.ALERT_FIRING else IncidentState.CLOSED
    incident = Incident(
        incident_id=str(inc["incident_id"]), run_id=run_id, state=state, kind=kind,
        started_at=_started(inc),
    )
    return incident, event


def _started(inc: Mapping[str, Any]) -> float | None:
    value = inc.get("started_at")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def incident_to_json(incident: Incident) -> dict[str, Any]:
    return {"incident_id": incident.incident_id, "run_id": incident.run_id,
            "state": incident.state.value, "kind": incident.kind.value,
            "started_at": incident.started_at}


def incident_from_json(data: Mapping[str, Any]) -> Incident:
    return Incident(incident_id=data["incident_id"], run_id=data["run_id"],
                    state=IncidentState(data["state"]), kind=IncidentKind(data["kind"]),
                    started_at=data.get("started_at"))
