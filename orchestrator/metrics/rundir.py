"""Read a run directory's records for the report, tolerating a run that is still being written.

A JSONL file being appended to may end in half a line, and a crashed writer may leave a garbage
line; both are skipped and counted, never fatal. Step records are thinned for plotting (at most
``max_points`` kept, evenly spread) while goodput sees every step through a bounded ledger.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.controller.records import BadStepRecord, EvalRecord, StepRecord
from orchestrator.metrics.goodput import TERMINAL_STATES, GoodputReport, compute_goodput
from orchestrator.metrics.ledger import StepLedger
from orchestrator.shared.files import read_jsonl


@dataclass
class Skipped:
    """Lines a reader could not use, per file (partial last line, corrupt line, bad record)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


def iter_jsonl(path: Path, skipped: Skipped) -> Iterator[dict[str, Any]]:
    """JSON objects of ``path`` one by one; a missing file is empty; each other line (a torn
    one) counts in ``skipped``."""
    yield from read_jsonl(path, on_skip=lambda: skipped.add(path.name))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


class Thinned:
    """Keep at most ``limit`` items spread evenly over a stream of unknown length."""

    def __init__(self, limit: int) -> None:
        self.limit = max(2, limit)
        self.stride = 1
        self._n = 0
        self.items: list[StepRecord] = []
        self.last: StepRecord | None = None

    def add(self, item: StepRecord) -> None:
        if self._n % self.stride == 0:
            self.items.append(item)
            if len(self.items) > self.limit:
                self.items = self.items[::2]
                self.stride *= 2
        self._n += 1
        self.last = item

    def result(self) -> list[StepRecord]:
        """The kept items plus the newest one (so the plot reaches the present)."""
        if self.last is not None and (not self.items or self.items[-1] is not self.last):
            return [*self.items, self.last]
        return list(self.items)


@dataclass
class RunData:
    run_dir: Path
    steps: list[StepRecord]
    evals: list[EvalRecord]
    total_steps: int
    timeline: list[dict[str, Any]]
    events: list[dict[str, Any]]
    run_info: dict[str, Any]
    summary: dict[str, Any]
    goodput: GoodputReport
    now: float
    finished: bool
    skipped: dict[str, int]


def load_run(run_dir: Path, *, now: float, max_points: int = 5000,
             rolling_window_s: float = 300.0) -> RunData:
    """Everything the report shows, as of ``now`` (the end of a run still going)."""
    run_dir = Path(run_dir)
    skipped = Skipped()
    ledger = StepLedger()
    thin = Thinned(max_points)
    evals: list[EvalRecord] = []
    total = 0
    for row in iter_jsonl(run_dir / "metrics.jsonl", skipped):
        if row.get("kind") == "eval":  # an eval record (EvalRecord.to_dict), not a step's
            _add_eval(evals, row, skipped, max_points)
            continue
        try:
            rec = StepRecord.from_dict(row)
        except BadStepRecord:
            skipped.add("metrics.jsonl")
            continue
        total += 1
        ledger.add(rec)
        thin.add(rec)
    timeline = [r for r in iter_jsonl(run_dir / "timeline.jsonl", skipped)
                if isinstance(r.get("state"), str) and isinstance(r.get("at"), (int, float))]
    timeline.sort(key=lambda r: (float(r["at"]), r.get("seq", 0)))
    events = list(iter_jsonl(run_dir / "events.jsonl", skipped))
    finished = bool(timeline) and timeline[-1]["state"] in TERMINAL_STATES
    goodput = compute_goodput(timeline, ledger.items(), now=now,
                              rolling_window_s=rolling_window_s)
    return RunData(run_dir=run_dir, steps=thin.result(), evals=evals, total_steps=total,
                   timeline=timeline,
                   events=events, run_info=_read_json(run_dir / "run.json"),
                   summary=_read_json(run_dir / "summary.json"), goodput=goodput, now=now,
                   finished=finished, skipped=dict(skipped.counts))


def _add_eval(evals: list[EvalRecord], row: dict[str, Any], skipped: Skipped,
              limit: int) -> None:
    """An eval line (``EvalRecord.to_dict``) kept for the report (the newest ``limit``); a
    malformed one is counted as skipped."""
    try:
        evals.append(EvalRecord(
            step=int(row["step"]), loss=float(row["loss"]),
            wall_time=float(row.get("wall_time") or 0.0), tokens=int(row.get("tokens") or 0),
            split=str(row.get("split") or "eval"),
            metrics={str(k): float(v) for k, v in (row.get("metrics") or {}).items()},
            seconds=float(row.get("seconds") or 0.0)))
    except (KeyError, TypeError, ValueError, AttributeError, BadStepRecord):
        skipped.add("metrics.jsonl")
        return
    if len(evals) > limit:
        del evals[0]


def event_time(row: dict[str, Any]) -> float | None:
    """When an events.jsonl line happened (recorded ``at``, else the event's observed time)."""
    for value in (row.get("at"), (row.get("event") or {}).get("observed_at"),
                  row.get("observed_at")):
        if isinstance(value, (int, float)):
            return float(value)
    return None


def event_label(row: dict[str, Any]) -> str:
    """'preemption_notice (host 1): accepted' or 'preemption_notice: drain' for actions."""
    ev = row.get("event") if isinstance(row.get("event"), dict) else {}
    kind = str(row.get("kind") or ev.get("kind") or "event")
    target = ev.get("target") if isinstance(ev.get("target"), dict) else {}
    where = ", ".join(f"{k} {v}" for k, v in target.items() if v not in (None, ""))
    what = row.get("action") or row.get("decision") or ""
    return f"{kind}{f' ({where})' if where else ''}{f': {what}' if what else ''}"
