"""Durable memory of the service: per-run history, handled incidents, scheduled retries.

One JSON file, replaced atomically after every change, so a restarted service makes the same
decisions (no second resubmission for an incident it already handled). The audit log and the dead
letters are append-only JSONL beside it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from typing import Any

from policies.autoresume import RunHistory

MAX_REMEMBERED_INCIDENTS = 1000  # per run; old ids fall off (incidents auto-close in hours)


@dataclass(frozen=True, kw_only=True)
class Pending:
    """An incident to look at again at ``not_before`` (backoff, unreachable cluster)."""

    incident: dict[str, Any]
    not_before: float
    attempts: int = 0
    why: str = ""


_ID_SETS = ("handled_incidents", "closed_incidents")


def _history_to_json(h: RunHistory, order: dict[str, list[str]]) -> dict[str, Any]:
    """Incident ids are written oldest first (the order they were added), so pruning after a
    restart still drops the oldest."""
    return {"submissions": list(h.submissions), "restart_times": list(h.restart_times),
            "last_action_at": h.last_action_at,
            **{name: _ordered(order.get(name, []), getattr(h, name)) for name in _ID_SETS},
            "gave_up": h.gave_up, "stopped": list(h.stopped)}


def _history_from_json(d: dict[str, Any]) -> RunHistory:
    return RunHistory(
        submissions=tuple(d.get("submissions", ())),
        restart_times=tuple(float(t) for t in d.get("restart_times", ())),
        last_action_at=d.get("last_action_at"),
        handled_incidents=frozenset(d.get("handled_incidents", ())),
        closed_incidents=frozenset(d.get("closed_incidents", ())),
        gave_up=bool(d.get("gave_up", False)),
        stopped=tuple(d.get("stopped", ())),
    )


def _ordered(previous: list[str], ids: frozenset[str]) -> list[str]:
    """``ids`` oldest first: those already known keep their place, new ones go last; at most
    MAX_REMEMBERED_INCIDENTS, the oldest dropped (never by name: ids are not ordered by time)."""
    kept = [i for i in previous if i in ids]
    known = set(kept)
    added = sorted(i for i in ids if i not in known)  # several in one update: any fixed order
    return (kept + added)[-MAX_REMEMBERED_INCIDENTS:]


class StateStore:
    """state.json in ``state_dir``; every mutation is written through (fsync, atomic rename)."""

    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(state_dir, "state.json")
        self.runs: dict[str, RunHistory] = {}
        self.pending: dict[str, Pending] = {}
        self._order: dict[str, dict[str, list[str]]] = {}  # run -> id set -> ids oldest first
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return
        self.runs = {k: _history_from_json(v) for k, v in data.get("runs", {}).items()}
        self._order = {k: {name: list(v.get(name, ())) for name in _ID_SETS}
                       for k, v in data.get("runs", {}).items()}
        self.pending = {k: Pending(**v) for k, v in data.get("pending", {}).items()}

    def save(self) -> None:
        data = {"runs": {k: _history_to_json(v, self._order.get(k, {}))
                         for k, v in self.runs.items()},
                "pending": {k: vars(v) for k, v in self.pending.items()}}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".state-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def history(self, run_id: str) -> RunHistory:
        return self.runs.get(run_id, RunHistory())

    def update(self, run_id: str, **changes: Any) -> RunHistory:
        h = replace(self.history(run_id), **changes)
        order = self._order.setdefault(run_id, {})
        for name in _ID_SETS:
            order[name] = _ordered(order.get(name, []), getattr(h, name))
        h = replace(h, **{name: frozenset(order[name]) for name in _ID_SETS})
        self.runs[run_id] = h
        self.save()
        return h


class JsonlLog:
    """Append-only JSON lines (audit log, dead letters)."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True, default=str) + "\n")

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                return [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []
