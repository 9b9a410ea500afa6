"""Cloud Monitoring alert notifications in the Pub/Sub channel's real format (schema 1.2)."""

from __future__ import annotations

import json
from typing import Any


def notification(*, incident_id: str, run_id: str, state: str = "open",
                 kind: str = "heartbeat_absent", started_at: int = 1_700_000_000,
                 metric: str = "heartbeat") -> dict[str, Any]:
    """One notification as Cloud Monitoring publishes it for deploy/terraform's policies."""
    return {
        "version": "1.2",
        "incident": {
            "incident_id": incident_id,
            "scoping_project_id": "demo-project",
            "scoping_project_number": 123456789,
            "url": "https://console.cloud.google.com/monitoring/alerting/incidents/x",
            "started_at": started_at,
            "ended_at": started_at + 600 if state == "closed" else None,
            "state": state,
            "summary": f"custom/tpu_orchestrator/{metric} for {run_id} is absent",
            "apigee_url": "",
            "observed_value": "",
            "resource": {"type": "generic_task", "labels": {
                "project_id": "demo-project", "location": "global",
                "namespace": "tpu-orchestrator", "job": run_id, "task_id": "driver"}},
            "resource_type_display_name": "Generic Task",
            "resource_id": "",
            "resource_display_name": "",
            "resource_name": "",
            "metric": {"type": f"custom.googleapis.com/tpu_orchestrator/{metric}",
                       "displayName": metric, "labels": {"run_id": run_id}},
            "metadata": {"system_labels": {}, "user_labels": {}},
            "policy_name": "tpu-orchestrator: heartbeat absent",
            "policy_user_labels": {"kind": kind, "app": "tpu-orchestrator"},
            "documentation": {"content": "resubmit", "mime_type": "text/markdown"},
            "condition": {"name": "projects/demo-project/alertPolicies/1/conditions/2",
                          "displayName": "heartbeat metric absent"},
            "condition_name": "heartbeat metric absent",
            "threshold_value": "",
            "condition_threshold_value": "",
        },
    }


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode("utf-8")
