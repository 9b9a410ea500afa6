"""Publish the run's numbers through ``ray.util.metrics`` (Ray dashboard, Prometheus scrape).

Harmless without Ray: when ``ray.is_initialized()`` is false the sink does nothing, so unit tests
and offline report runs never start or connect to a cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.controller.listener import RunListener
from orchestrator.controller.records import StepRecord

if TYPE_CHECKING:
    from orchestrator.lifecycle import Transition

log = structlog.get_logger(__name__)

_GAUGES = {
    "loss": "Training loss of the last step.",
    "step_time_seconds": "Wall time of the last step.",
    "tokens_per_second": "Tokens per second of the last step.",
    "mfu": "Model FLOPs utilisation of the last step (fraction of peak).",
    "step": "Last completed step (a heartbeat).",
    "incarnation": "Current incarnation of the JAX group (re-forms so far).",
    "slices": "Slices in the current mesh.",
}


class RayMetricsSink(RunListener):
    """Gauges per step and a counter of restarts by cause, tagged with the job name."""

    name = "ray_metrics"

    def __init__(self, *, job: str, prefix: str = "tpu_orchestrator") -> None:
        self._job = job
        self._prefix = prefix
        self._gauges: dict[str, Any] | None = None
        self._restarts: Any = None
        self._state: Any = None

    def _ready(self) -> bool:
        import ray

        if not ray.is_initialized():
            return False
        if self._gauges is None:
            from ray.util.metrics import Counter, Gauge

            self._gauges = {k: Gauge(f"{self._prefix}_{k}", description=d, tag_keys=("job",))
                            for k, d in _GAUGES.items()}
            self._restarts = Counter(f"{self._prefix}_restarts", description="Group re-forms.",
                                     tag_keys=("job", "cause"))
            self._state = Gauge(f"{self._prefix}_state", description="1 for the current state.",
                                tag_keys=("job", "state"))
        return True

    def on_step(self, rec: StepRecord) -> None:
        if not self._ready():
            return
        assert self._gauges is not None
        tags = {"job": self._job}
        values = {"loss": rec.loss, "step_time_seconds": rec.step_time_s,
                  "tokens_per_second": rec.tokens_per_second, "mfu": rec.mfu,
                  "step": float(rec.step), "incarnation": float(rec.incarnation),
                  "slices": float(rec.slices)}
        for key, value in values.items():
            self._gauges[key].set(value, tags=tags)

    def on_transition(self, t: Transition) -> None:
        if not self._ready():
            return
        prev = t.prev.value if t.prev is not None else "None"
        self._state.set(0.0, tags={"job": self._job, "state": prev})
        self._state.set(1.0, tags={"job": self._job, "state": t.state.value})
        cause = t.restart_cause  # the typed Planning payload's
        if cause is not None:
            self._restarts.inc(1.0, tags={"job": self._job, "cause": cause})
