"""The one small interface every metric destination implements.

No-op defaults let a sink care only about what it shows (the console ignores events, the JSONL
sink ignores transitions). Sinks run on their own worker thread (see ``pipeline``), so a method
may block on I/O without slowing training; it should still not raise, but if it does the
pipeline counts and logs it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.metrics.records import EvalRecord, StepRecord


class MetricSink:
    """Base class with no-op hooks. ``queue_size`` overrides the pipeline's default buffer."""

    name: str = "sink"
    queue_size: int | None = None

    def on_step(self, rec: StepRecord) -> None:
        """A step finished (host 0's record, forwarded by the driver)."""

    def on_transition(self, t: dict[str, Any]) -> None:
        """A lifecycle transition (a timeline.jsonl line)."""

    def on_event(self, e: dict[str, Any]) -> None:
        """An event the driver handled (preemption notice, host lost, operator drain...)."""

    def on_eval(self, rec: EvalRecord) -> None:
        """An evaluation finished (the task's eval results, forwarded by the driver)."""

    def flush(self) -> None:
        """Push out anything buffered."""

    def close(self) -> None:
        """Flush and release resources; called once, last."""
