"""A bounded window of seen event ids that survives a driver restart.

Delivery is at-least-once (Pub/Sub redelivers, an operator may publish twice, a restarted driver
sees unacked messages again), so the intake drops ids it has already recorded. The window keeps
the newest ``capacity`` ids (insertion order) and is saved to ``RUN_DIR/event_dedupe.json`` by
atomic write-and-rename. Because events.jsonl is written before the window is saved, loading
also folds in the ids of the last lines of events.jsonl: a crash between the two loses nothing.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import structlog

from orchestrator.shared.files import atomic_write_json

log = structlog.get_logger(__name__)

FORMAT_VERSION = 1


class DedupeWindow:
    """Thread-safe ordered set of the last ``capacity`` ids."""

    def __init__(self, capacity: int, path: Path | None = None) -> None:
        self.capacity = capacity
        self.path = path
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._dirty = False

    def __contains__(self, event_id: object) -> bool:
        with self._lock:
            return event_id in self._ids

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)

    def add(self, event_id: str) -> bool:
        """Remember ``event_id``; False if it was already there."""
        with self._lock:
            if event_id in self._ids:
                return False
            self._ids[event_id] = None
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)
            self._dirty = True
            return True

    def extend(self, ids: Iterable[str]) -> None:
        for event_id in ids:
            self.add(event_id)

    def load(self, recent_log_ids: Iterable[str] = ()) -> None:
        """Read the saved window (a corrupt file is logged and ignored) plus recent log ids."""
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                ids = data["ids"] if isinstance(data, dict) else None
                if not isinstance(ids, list):
                    raise ValueError("no ids list")
                self.extend(i for i in ids if isinstance(i, str))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("event_dedupe_unreadable", path=str(self.path), error=str(exc),
                            fix="delete the file; duplicates of old events may then be re-handled")
        self.extend(recent_log_ids)
        with self._lock:
            self._dirty = False

    def save(self, *, force: bool = False) -> None:
        """Atomic write of the window when it changed."""
        if self.path is None:
            return
        with self._lock:
            if not (self._dirty or force):
                return
            payload = {"version": FORMAT_VERSION, "capacity": self.capacity,
                       "ids": list(self._ids)}
            self._dirty = False
        atomic_write_json(self.path, payload, separators=(",", ":"))
