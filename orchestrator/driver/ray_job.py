"""What Ray tells a driver started by ``ray job submit``: its job config and submission id
(both empty outside a Ray job). Read from the environment Ray sets; no Ray import."""

from __future__ import annotations

import json
import os

from orchestrator.raygroup.topology import JOB_CONFIG_ENV


def job_config() -> dict:
    """The job config Ray hands a driver started by ``ray job submit`` (else empty)."""
    try:
        data = json.loads(os.environ.get(JOB_CONFIG_ENV) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def submission_id() -> str | None:
    """Ray 2.60 passes the submission id only inside the job config's metadata."""
    meta = job_config().get("metadata") or {}
    return meta.get("job_submission_id") or os.environ.get("RAY_JOB_SUBMISSION_ID")
