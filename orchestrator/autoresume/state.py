"""Durable memory of the service: per-run history, handled incidents, scheduled retries.

One JSON file, replaced atomically after every change, so a restarted service makes the same
decisions (no second resubmission for an incident it already handled). The audit log and the dead
letters are JSONL beside it, rotated by size (``<name>.1`` ... ``<name>.<keep>``, oldest dropped).
Scheduled retries are capped, in all and per run, so a flood of incidents cannot grow the state
without bound.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.shared.files import append_jsonl, atomic_write_json, jsonl_line, read_jsonl
from policies.autoresume import RunHistory

MAX_REMEMBERED_INCIDENTS = 1000  # per run; old ids fall off (incidents auto-close in hours)
MAX_PENDING = 1000  # scheduled retries in all
MAX_PENDING_PER_RUN = 8  # one incident resumes a run; a few more are only repeats
LOG_MAX_BYTES = 16 * 1024 * 1024  # per JSONL file before it is rotated
LOG_KEEP = 3  # rotated files kept


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
        atomic_write_json(self.path, data, fsync=True, mode=0o600, indent=1, sort_keys=True)

    def add_pending(self, key: str, pending: Pending) -> str | None:
        """Schedule ``pending`` under ``key`` and save; or, when the caps are reached, leave the
        state alone and return why (a retry of an incident already scheduled always fits)."""
        if key not in self.pending:
            run = pending.incident.get("run_id")
            of_run = sum(1 for p in self.pending.values() if p.incident.get("run_id") == run)
            if of_run >= MAX_PENDING_PER_RUN:
                return f"{of_run} retries of run {run!r} are already scheduled"
            if len(self.pending) >= MAX_PENDING:
                return f"{len(self.pending)} retries are already scheduled (MAX_PENDING)"
        self.pending[key] = pending
        self.save()
        return None

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
    """JSON lines, appended; past ``max_bytes`` the file becomes ``<path>.1`` (older ones shift
    up to ``<path>.<keep>``, the oldest is dropped), so the log stays under
    ``(keep + 1) * max_bytes``."""

    def __init__(self, path: str, *, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep

    def write(self, record: dict[str, Any]) -> None:
        line = jsonl_line(record, sort_keys=True, default=str)
        try:
            size = os.path.getsize(self.path)
        except OSError:
            size = 0
        if size and size + len(line.encode("utf-8")) > self.max_bytes:
            self._rotate()
        append_jsonl(self.path, line)

    def _rotate(self) -> None:
        for n in range(self.keep, 0, -1):
            older = f"{self.path}.{n - 1}" if n > 1 else self.path
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{n}")
        if self.keep <= 0:
            os.remove(self.path)

    def files(self) -> list[str]:
        """The log's files, oldest first."""
        rotated = [f"{self.path}.{n}" for n in range(self.keep, 0, -1)]
        return [p for p in (*rotated, self.path) if os.path.exists(p)]

    def read(self) -> list[dict[str, Any]]:
        """Every record still kept, oldest first; ValueError on a line that is not one."""
        return [r for path in self.files() for r in read_jsonl(path, strict=True)]
