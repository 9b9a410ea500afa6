"""Who is reporting: the monitored resource every exported series is attached to.

Cloud Monitoring's ``generic_task`` resource (labels project_id, location, namespace, job,
task_id) fits a training job; the slice and host a number belongs to travel as metric labels,
because a monitored resource's labels are fixed by its type.
"""

from __future__ import annotations

from dataclasses import dataclass

RESOURCE_TYPE = "generic_task"


@dataclass(frozen=True, kw_only=True)
class ResourceIdentity:
    """Labels of the ``generic_task`` monitored resource for this run."""

    project_id: str
    location: str = "global"
    namespace: str = "tpu-orchestrator"
    job: str = "default"
    task_id: str = "driver"

    def labels(self) -> dict[str, str]:
        return {"project_id": self.project_id, "location": self.location,
                "namespace": self.namespace, "job": self.job, "task_id": self.task_id}
