"""Pure layout choices for the report's figure (issue 32 item 7): a time unit that fits the run,
and event labels that never overlap on the state strip."""

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
class LabelLayout:
    """``rows[i]``: the row label i goes in, or None when it was left out; ``skipped`` counts
    those (the figure says how many, the events table has them all)."""

    rows: list[int | None]
    lefts: list[float]
    skipped: int


def layout_labels(xs: Sequence[float], widths: Sequence[float], *, rows: int = 4,
                  gap: float = 0.0, lo: float = float("-inf"),
                  hi: float = float("inf")) -> LabelLayout:
    """Stack labels (anchored at ``xs[i]``, ``widths[i]`` wide, same units) into ``rows`` rows
    so that no two in a row overlap: each goes in the lowest row whose last label ends (plus
    ``gap``) before it starts, else it is skipped. A label that would run past ``hi`` is moved
    left to end there (``lefts``); none starts before ``lo``. Taken left to right."""
    if len(xs) != len(widths):
        raise ValueError("xs and widths differ in length")
    ends = [float("-inf")] * max(1, rows)
    out: list[int | None] = [None] * len(xs)
    lefts = [max(lo, min(x, hi - w)) for x, w in zip(xs, widths, strict=True)]
    skipped = 0
    for i in sorted(range(len(xs)), key=lambda k: (lefts[k], k)):
        row = next((r for r, end in enumerate(ends) if end + gap <= lefts[i]), None)
        if row is None:
            skipped += 1
            continue
        out[i], ends[row] = row, lefts[i] + widths[i]
    return LabelLayout(rows=out, lefts=lefts, skipped=skipped)
