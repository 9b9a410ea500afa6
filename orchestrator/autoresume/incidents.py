"""From a Cloud Monitoring notification to the policy's ``Incident``.

Parsing and validation are the event intake's (``orchestrator.events.alerts``); this adds the two
things autoresume needs that the generic event does not carry, read from the notification:

* the run: ``incident.metric.labels.run_id``, else the ``generic_task`` resource's ``job`` label
  (what the metric exporter writes), else a ``job`` / ``run_id`` policy user label;
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

RUN_LABELS = ("run_id", "job")
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


def incident_from_notification(payload: object, *, now: float) -> tuple[Incident, Event]:
    """Validate and convert; raise ``MalformedEvent`` (reason for the dead letter) otherwise."""
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

    run_id = (_text(metric_labels.get("run_id")) or _text(resource_labels.get("job"))
              or event.target.job or _text(user_labels.get("run_id")))
    if run_id is None:
        raise MalformedEvent(
            "the incident names no run: no metric label run_id, resource label job, or policy "
            "user label job/run_id",
            fix="group the alert condition by metric.label.run_id / resource.label.job "
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
