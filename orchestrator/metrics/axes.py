"""Pure layout choices for the report's figure (issue 32 item 7, issue 53 item 7): a time unit
that fits the run, and numbered marks whose labels never overlap on the state strip."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SECONDS_UP_TO_S = 120.0  # a run under ~2 minutes reads best in seconds
MINUTES_UP_TO_S = 7200.0  # then minutes up to ~2 hours, hours beyond


def time_unit(span_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for a time axis spanning ``span_s`` seconds, so a 27 s run
    is not drawn on a 0.00-0.45 minutes axis."""
    if span_s < SECONDS_UP_TO_S:
        return 1.0, "seconds"
    if span_s < MINUTES_UP_TO_S:
        return 60.0, "minutes"
    return 3600.0, "hours"


@dataclass(frozen=True)
class MarkGroup:
    """Marks ``first``..``last`` (1-based numbers, as the legend lists them) under one label
    that starts at ``left``: marks too close to be told apart share a label (``3-7``)."""

    first: int
    last: int
    left: float

    @property
    def text(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def group_marks(xs: Sequence[float], *, char_width: float, gap: float = 0.0,
                lo: float = float("-inf"), hi: float = float("inf")) -> list[MarkGroup]:
    """Number the marks at ``xs`` (ascending) 1, 2, ... and label them in one row that never
    overlaps: a mark that starts before the previous label ends (plus ``gap``) joins it, so
    every mark is labelled and none is left out. A label is ``char_width`` a character wide;
    none starts before ``lo`` or ends past ``hi`` (the last may merge into the one before)."""
    groups: list[MarkGroup] = []

    def end(g: MarkGroup) -> float:
        return g.left + len(g.text) * char_width

    for number, x in enumerate(xs, start=1):
        if groups and x < end(groups[-1]) + gap:
            groups[-1] = MarkGroup(groups[-1].first, number, groups[-1].left)
        else:
            groups.append(MarkGroup(number, number, max(lo, x)))
    while groups:
        last = groups[-1]
        left = min(last.left, hi - len(last.text) * char_width)
        if len(groups) == 1 or left >= end(groups[-2]) + gap:
            groups[-1] = MarkGroup(last.first, last.last, max(lo, left))
            break
        prev = groups.pop(-2)
        groups[-1] = MarkGroup(prev.first, last.last, prev.left)
    return groups
