"""Reduce the steps of one export window to one value per metric (pure).

Cloud Monitoring takes one point per series every 5 s at most; steps come every few ms. Means
for loss, MFU and grad norm, the median for step time (robust to the compile or checkpoint step),
tokens over step time for throughput, and the last step for the heartbeat.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from orchestrator.controller.records import StepRecord


@dataclass(frozen=True, kw_only=True)
class WindowValues:
    loss: float
    mfu: float
    step_time: float
    tokens_per_second: float
    grad_norm: float
    last_step: int
    peak_source: str
    steps: int


@dataclass
class WindowAggregator:
    """Accumulates step records until ``take()`` closes the window."""

    _recs: list[StepRecord] = field(default_factory=list)

    def add(self, rec: StepRecord) -> None:
        self._recs.append(rec)

    def __len__(self) -> int:
        return len(self._recs)

    def take(self) -> WindowValues | None:
        """Values of the window so far (None when empty) and start a new window."""
        recs, self._recs = self._recs, []
        if not recs:
            return None
        finite_loss = [r.loss for r in recs if math.isfinite(r.loss)]
        finite_gn = [r.grad_norm for r in recs if math.isfinite(r.grad_norm)]
        total_time = sum(max(0.0, r.step_time_s) for r in recs)
        return WindowValues(
            loss=statistics.fmean(finite_loss) if finite_loss else math.nan,
            mfu=statistics.fmean(r.mfu for r in recs),
            step_time=statistics.median(r.step_time_s for r in recs),
            tokens_per_second=sum(r.tokens for r in recs) / total_time if total_time > 0 else 0.0,
            grad_norm=statistics.fmean(finite_gn) if finite_gn else math.nan,
            last_step=max(r.step for r in recs),
            peak_source=recs[-1].peak_source,
            steps=len(recs),
        )
