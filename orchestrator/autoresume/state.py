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


def _history_to_json(h: RunHistory) -> dict[str, Any]:
    return {"submissions": list(h.submissions), "restart_times": list(h.restart_times),
            "last_action_at": h.last_action_at, "handled_incidents": sorted(h.handled_incidents),
            "closed_incidents": sorted(h.closed_incidents), "gave_up": h.gave_up}


def _history_from_json(d: dict[str, Any]) -> RunHistory:
    return RunHistory(
        submissions=tuple(d.get("submissions", ())),
        restart_times=tuple(float(t) for t in d.get("restart_times", ())),
        last_action_at=d.get("last_action_at"),
        handled_incidents=frozenset(d.get("handled_incidents", ())),
        closed_incidents=frozenset(d.get("closed_incidents", ())),
        gave_up=bool(d.get("gave_up", False)),
    )


def _trim(ids: frozenset[str]) -> frozenset[str]:
    return ids if len(ids) <= MAX_REMEMBERED_INCIDENTS else frozenset(
        sorted(ids)[-MAX_REMEMBERED_INCIDENTS:])


class StateStore:
    """state.json in ``state_dir``; every mutation is written through."""

    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(state_dir, "state.json")
        self.runs: dict[str, RunHistory] = {}
        self.pending: dict[str, Pending] = {}
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return
        self.runs = {k: _history_from_json(v) for k, v in data.get("runs", {}).items()}
        self.pending = {k: Pending(**v) for k, v in data.get("pending", {}).items()}

    def save(self) -> None:
        data = {"runs": {k: _history_to_json(v) for k, v in self.runs.items()},
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
        h = replace(h, handled_incidents=_trim(h.handled_incidents),
                    closed_incidents=_trim(h.closed_incidents))
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
