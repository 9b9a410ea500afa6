"""Bounded memory of past steps for live goodput (console, Cloud Monitoring, the report).

A long run at 10 ms steps reports millions of records; goodput needs, per step, only its
incarnation, number, end time, step time and blocking checkpoint time. The newest ``exact``
steps are kept one by one (a rollback re-does recent steps); older ones are merged into spans of
``span`` consecutive steps of one incarnation. A merged span counts as lost only when all of it
was rolled back, so goodput may be off by at most one span's time per rollback that reaches
further back than ``exact`` steps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from orchestrator.controller.records import StepRecord


@dataclass(frozen=True, kw_only=True)
class StepSpan:
    """``count`` consecutive steps of one incarnation from ``step`` on, merged."""

    step: int
    incarnation: int
    wall_time: float
    step_time_s: float
    checkpoint_blocking_s: float
    count: int = 1

    @classmethod
    def of(cls, rec: StepRecord) -> StepSpan:
        return cls(step=rec.step, incarnation=rec.incarnation, wall_time=rec.wall_time,
                   step_time_s=rec.step_time_s, checkpoint_blocking_s=rec.checkpoint_blocking_s)


class StepLedger:
    """Append steps; ``items()`` gives the spans and recent steps goodput reads."""

    def __init__(self, *, exact: int = 20_000, span: int = 1_000) -> None:
        if exact < 1 or span < 1:
            raise ValueError("exact and span must be >= 1")
        self._exact = exact
        self._span = span
        self._recent: deque[StepSpan] = deque()
        self._merged: list[StepSpan] = []

    def add(self, rec: StepRecord | StepSpan) -> None:
        self._recent.append(rec if isinstance(rec, StepSpan) else StepSpan.of(rec))
        while len(self._recent) > self._exact:
            self._fold(self._recent.popleft())

    def _fold(self, item: StepSpan) -> None:
        last = self._merged[-1] if self._merged else None
        if (last is not None and last.incarnation == item.incarnation and last.count < self._span
                and item.step > last.step):
            self._merged[-1] = StepSpan(
                step=last.step, incarnation=last.incarnation, wall_time=item.wall_time,
                step_time_s=last.step_time_s + item.step_time_s,
                checkpoint_blocking_s=last.checkpoint_blocking_s + item.checkpoint_blocking_s,
                count=last.count + item.count)
        else:
            self._merged.append(item)

    def items(self) -> list[StepSpan]:
        return [*self._merged, *self._recent]

    def __len__(self) -> int:
        return len(self._merged) + len(self._recent)
