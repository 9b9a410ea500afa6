"""Goodput and badput from the lifecycle timeline and the step records (pure: time is passed in).

Every second of the run's wall time lands in exactly one bucket, so productive + sum(badput) ==
wall time:

- productive: time in RUNNING (and HANDING_OVER, where steps go on while a drain's copy is
  handed to the replacement), minus the time of steps that were later re-done (lost) and minus
  the blocking part of checkpoint saves taken inside RUNNING;
- badput by cause: ``startup`` (PLANNING/FORMING before the first RUNNING), ``reform``
  (PLANNING/FORMING after it: re-forming the group), ``compile``, ``restore``, ``drain``,
  ``checkpoint`` (CHECKPOINTING + blocking saves), ``release``, ``waiting_for_capacity``,
  ``backoff``, ``lost_steps`` (steps executed, then rolled back by a restore to an earlier
  checkpoint), ``idle`` (anything else: unknown states, gaps).

A state lasts from its transition to the next one; the last state of a run still going ends at
``now`` (the injected clock), a terminal state (SUCCEEDED/FAILED/STOPPED) ends at once.
A step is lost when a later incarnation resumed from an earlier step than it: its step time is
moved from productive to ``lost_steps`` in the RUNNING interval where it ran.
Per slice, the same buckets are counted over the intervals the slice was a member of, plus
``absent`` for the time it was not in the mesh; its goodput is over the whole run's wall time.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.lifecycle import RunState
from orchestrator.metrics.ml_goodput import ml_badput


class StepLike(Protocol):
    """What goodput needs of a step: a StepLike, or a StepSpan of several merged steps."""

    @property
    def step(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def wall_time(self) -> float: ...
    @property
    def step_time_s(self) -> float: ...
    @property
    def checkpoint_blocking_s(self) -> float: ...

CAUSES: tuple[str, ...] = ("startup", "reform", "compile", "restore", "drain", "checkpoint",
                           "release", "waiting_for_capacity", "backoff", "lost_steps", "idle")
TERMINAL_STATES = frozenset(s.value for s in RunState if s.terminal)
TRAINING_STATES = ("RUNNING", "HANDING_OVER")
"""States whose time is productive: the hosts run steps in both."""

_STATE_CAUSE = {
    "COMPILING": "compile",
    "RESTORING": "restore",
    "DRAINING": "drain",
    "CHECKPOINTING": "checkpoint",
    "RELEASING": "release",
    "WAITING_FOR_CAPACITY": "waiting_for_capacity",
    "BACKOFF": "backoff",
}


@dataclass(frozen=True, kw_only=True)
class Interval:
    """One stretch of the run in one state, with its time split into buckets."""

    state: str
    start: float
    end: float
    incarnation: int
    slices: tuple[str, ...]
    productive_s: float
    badput_s: dict[str, float]

    @property
    def duration_s(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class SliceGoodput:
    productive_s: float
    badput_s: dict[str, float]
    goodput: float


@dataclass(frozen=True, kw_only=True)
class GoodputSample:
    """Goodput as seen at time ``t``: cumulative since the start and over the rolling window."""

    t: float
    cumulative: float
    rolling: float


@dataclass(frozen=True, kw_only=True)
class GoodputReport:
    start: float
    end: float
    wall_s: float
    productive_s: float
    badput_s: dict[str, float]
    goodput: float
    rolling_goodput: float
    rolling_window_s: float
    lost_steps: int
    per_slice: dict[str, SliceGoodput]
    intervals: tuple[Interval, ...]
    series: tuple[GoodputSample, ...] = field(default=())

    @property
    def ml_badput_s(self) -> dict[str, float]:
        """The badput in ``ml-goodput-measurement``'s buckets (``metrics/ml_goodput.py``)."""
        return ml_badput(self.intervals)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for summary.json and the report (intervals and series left out)."""
        return {
            "start": self.start, "end": self.end, "wall_s": self.wall_s,
            "productive_s": self.productive_s, "goodput": self.goodput,
            "rolling_goodput": self.rolling_goodput, "rolling_window_s": self.rolling_window_s,
            "badput_s": dict(self.badput_s), "ml_goodput_badput_s": self.ml_badput_s,
            "lost_steps": self.lost_steps,
            "per_slice": {k: {"productive_s": v.productive_s, "goodput": v.goodput,
                              "badput_s": dict(v.badput_s)} for k, v in self.per_slice.items()},
        }


def _sorted_timeline(timeline: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    rows = [r for r in timeline if isinstance(r, Mapping) and isinstance(r.get("at"), (int, float))
            and isinstance(r.get("state"), str)]
    return sorted(rows, key=lambda r: (float(r["at"]), r.get("seq", 0)))


def _restart_steps(timeline: list[Mapping[str, Any]], steps: Sequence[StepLike]) -> dict[int, int]:
    """Per incarnation, the step it resumed from (state restored = steps <= this one kept)."""
    out: dict[int, int] = {}
    for r in timeline:
        if r["state"] == "RUNNING" and isinstance(r.get("step"), int):
            inc = int(r.get("incarnation", 0))
            out.setdefault(inc, int(r["step"]))
    first: dict[int, int] = {}
    for rec in steps:
        first[rec.incarnation] = min(first.get(rec.incarnation, rec.step), rec.step)
    for inc, step in first.items():
        out.setdefault(inc, step - 1)
    return out


def lost_step_records(timeline: Sequence[Mapping[str, Any]],
                      steps: Sequence[StepLike]) -> list[StepLike]:
    """Records of steps a later incarnation rolled back (they were, or will be, re-done)."""
    restart = _restart_steps(_sorted_timeline(timeline), steps)
    # min restart step over every later incarnation, per incarnation
    incs = sorted(restart, reverse=True)
    floor: dict[int, float] = {}
    running = float("inf")
    for k in incs:
        floor[k] = running
        running = min(running, restart[k])
    return [rec for rec in steps if rec.step > floor.get(rec.incarnation, running)]


def _cause_for(state: str, seen_running: bool) -> str | None:
    if state in TRAINING_STATES:
        return None
    if state in ("PLANNING", "FORMING"):
        return "reform" if seen_running else "startup"
    return _STATE_CAUSE.get(state, "idle")


def build_intervals(timeline: Sequence[Mapping[str, Any]], steps: Sequence[StepLike],
                    now: float) -> list[Interval]:
    """Split the run into state intervals with productive/badput seconds each."""
    rows = _sorted_timeline(timeline)
    if not rows:
        return []
    raw: list[tuple[str, float, float, int, tuple[str, ...]]] = []
    first = rows[0]
    prev_d = first.get("prev_duration_s")
    if isinstance(first.get("prev"), str) and isinstance(prev_d, (int, float)) and prev_d > 0:
        raw.append((first["prev"], float(first["at"]) - float(prev_d), float(first["at"]),
                    int(first.get("incarnation", 0)), ()))
    for i, r in enumerate(rows):
        start = float(r["at"])
        if i + 1 < len(rows):
            end = float(rows[i + 1]["at"])
        elif r["state"] in TERMINAL_STATES:
            end = start
        else:
            end = max(start, float(now))
        raw.append((r["state"], start, end, int(r.get("incarnation", 0)),
                    tuple(str(s) for s in (r.get("slices") or ()))))

    starts = [x[1] for x in raw]
    lost_by: dict[int, float] = {}
    ckpt_by: dict[int, float] = {}
    for rec in lost_step_records(rows, steps):
        idx = _interval_of(raw, starts, rec.wall_time)
        if idx is not None:
            lost_by[idx] = lost_by.get(idx, 0.0) + max(0.0, rec.step_time_s)
    for rec in steps:
        if rec.checkpoint_blocking_s > 0:
            idx = _interval_of(raw, starts, rec.wall_time)
            if idx is not None:
                ckpt_by[idx] = ckpt_by.get(idx, 0.0) + rec.checkpoint_blocking_s

    out = []
    seen_running = False
    for i, (state, start, end, inc, slices) in enumerate(raw):
        dur = end - start
        badput = dict.fromkeys(CAUSES, 0.0)
        productive = 0.0
        cause = _cause_for(state, seen_running)
        if cause is None:
            seen_running = True
            ckpt = min(ckpt_by.get(i, 0.0), dur)
            lost = min(lost_by.get(i, 0.0), dur - ckpt)
            badput["checkpoint"] = ckpt
            badput["lost_steps"] = lost
            productive = dur - ckpt - lost
        else:
            badput[cause] = dur
        out.append(Interval(state=state, start=start, end=end, incarnation=inc, slices=slices,
                            productive_s=productive, badput_s=badput))
    return out


def _interval_of(raw: list[tuple[str, float, float, int, tuple[str, ...]]], starts: list[float],
                 t: float) -> int | None:
    """Index of the training interval holding time ``t`` (a step ends inside RUNNING or
    HANDING_OVER)."""
    i = bisect.bisect_right(starts, t) - 1
    # a step reported exactly at a transition belongs to the RUNNING interval just before it
    for j in (i, i - 1):
        if 0 <= j < len(raw) and raw[j][0] in TRAINING_STATES and raw[j][1] <= t <= raw[j][2]:
            return j
    return None


def productive_between(intervals: Sequence[Interval], a: float, b: float) -> float:
    """Productive seconds in [a, b], spreading each interval's productive time evenly."""
    total = 0.0
    for iv in intervals:
        if iv.productive_s <= 0 or iv.duration_s <= 0:
            continue
        overlap = min(b, iv.end) - max(a, iv.start)
        if overlap > 0:
            total += iv.productive_s * overlap / iv.duration_s
    return total


def compute_goodput(timeline: Sequence[Mapping[str, Any]], steps: Sequence[StepLike], *,
                    now: float, rolling_window_s: float = 300.0,
                    samples: int = 200) -> GoodputReport:
    """Goodput of the run from its timeline and step records, as of ``now``."""
    intervals = build_intervals(timeline, steps, now)
    lost = sum(getattr(r, "count", 1) for r in lost_step_records(timeline, steps))
    if not intervals:
        return GoodputReport(start=now, end=now, wall_s=0.0, productive_s=0.0,
                             badput_s=dict.fromkeys(CAUSES, 0.0), goodput=0.0, rolling_goodput=0.0,
                             rolling_window_s=rolling_window_s, lost_steps=lost, per_slice={},
                             intervals=())
    start, end = intervals[0].start, intervals[-1].end
    wall = end - start
    productive = sum(iv.productive_s for iv in intervals)
    badput = {c: sum(iv.badput_s[c] for iv in intervals) for c in CAUSES}

    per_slice: dict[str, SliceGoodput] = {}
    names = sorted({s for iv in intervals for s in iv.slices})
    for name in names:
        mine = [iv for iv in intervals if name in iv.slices]
        s_prod = sum(iv.productive_s for iv in mine)
        s_bad = {c: sum(iv.badput_s[c] for iv in mine) for c in CAUSES}
        s_bad["absent"] = wall - sum(iv.duration_s for iv in mine)
        per_slice[name] = SliceGoodput(productive_s=s_prod, badput_s=s_bad,
                                       goodput=s_prod / wall if wall > 0 else 0.0)

    series = []
    n = max(2, samples)
    for k in range(n):
        t = start + wall * k / (n - 1)
        series.append(_sample(intervals, start, t, rolling_window_s))
    return GoodputReport(
        start=start, end=end, wall_s=wall, productive_s=productive, badput_s=badput,
        goodput=productive / wall if wall > 0 else 0.0,
        rolling_goodput=_sample(intervals, start, end, rolling_window_s).rolling,
        rolling_window_s=rolling_window_s, lost_steps=lost, per_slice=per_slice,
        intervals=tuple(intervals), series=tuple(series),
    )


def _sample(intervals: Sequence[Interval], start: float, t: float, window: float) -> GoodputSample:
    elapsed = t - start
    cumulative = productive_between(intervals, start, t) / elapsed if elapsed > 0 else 0.0
    w_start = max(start, t - window)
    w = t - w_start
    rolling = productive_between(intervals, w_start, t) / w if w > 0 else 0.0
    return GoodputSample(t=t, cumulative=cumulative, rolling=rolling)
