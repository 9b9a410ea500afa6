"""Append-only records in the run directory: events.jsonl and dead_letters.jsonl.

Every line is written and fsynced (``JsonlWriter.sync``) before the intake acknowledges the
message it came from, so a driver crash can at worst re-handle (and dedupe) a message, never lose
one; an accepted event the crashed driver never acted on is found again by
``EventIntake.replay_unhandled``. Payloads are stored as
received, truncated past ``MAX_RAW_CHARS`` with their size and sha256 kept.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_RAW_CHARS = 64 * 1024
TAIL_BYTES = 4 * 1024 * 1024


class JsonlWriter:
    """One append-only JSONL file; lines are written whole, flushed, and numbered."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self._fsync = fsync
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._seq = _last_seq(path)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    @property
    def seq(self) -> int:
        """Number of the last line written (0 for an empty file)."""
        return self._seq

    def write(self, record: dict[str, Any]) -> int:
        with self._lock:
            self._seq += 1
            line = json.dumps({"seq": self._seq, **record}, default=_json_default,
                              ensure_ascii=True, separators=(",", ":"))
            self._fh.write(line + "\n")
            self._fh.flush()
            if self._fsync:
                os.fsync(self._fh.fileno())
            return self._seq

    def sync(self) -> None:
        """Make every line written so far durable (before acknowledging what they record)."""
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                os.fsync(self._fh.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()


def raw_for_record(raw: Any) -> Any:
    """The payload as it can be stored: JSON values as-is when small, bytes as text or base64."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        data = bytes(raw)
        digest = hashlib.sha256(data).hexdigest()
        try:
            text: str | None = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(text) <= MAX_RAW_CHARS:
            return {"text": text, "bytes": len(data), "sha256": digest}
        if text is None and len(data) <= MAX_RAW_CHARS:
            return {"base64": base64.b64encode(data).decode("ascii"), "bytes": len(data),
                    "sha256": digest}
        return {"truncated": True, "head": data[:1024].decode("utf-8", "replace"),
                "bytes": len(data), "sha256": digest}
    try:
        text = json.dumps(raw, default=_json_default, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return {"unserializable": repr(raw)[:1024]}
    if len(text) <= MAX_RAW_CHARS:
        return raw
    data = text.encode("utf-8", "surrogatepass")
    return {"truncated": True, "head": text[:1024], "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def recent_event_ids(path: Path) -> list[str]:
    """Ids of events *accepted* in the tail of events.jsonl (to rebuild the dedupe window): a
    stale or irrelevant verdict is not remembered, so the same id may be judged again later."""
    ids: list[str] = []
    for line in _tail_lines(path):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("decision") != "accepted":
            continue
        event = record.get("event")
        if isinstance(event, dict) and isinstance(event.get("id"), str):
            ids.append(event["id"])
    return ids


def read_jsonl(path: Path, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Parsed lines (the last ``limit`` if given); unreadable lines are skipped."""
    if not path.exists():
        return []
    out = []
    for line in _tail_lines(path):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out[-limit:] if limit else out


def _last_seq(path: Path) -> int:
    last = 0
    for line in _tail_lines(path):
        try:
            seq = json.loads(line).get("seq")
        except (ValueError, AttributeError):
            continue
        if isinstance(seq, int):
            last = max(last, seq)
    return last


def _tail_lines(path: Path) -> Iterator[str]:
    if not path.exists():
        return
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if size > TAIL_BYTES:
            fh.seek(size - TAIL_BYTES)
            fh.readline()  # drop the partial first line
        for raw in fh:
            line = raw.decode("utf-8", "replace").strip()
            if line:
                yield line


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return raw_for_record(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)
