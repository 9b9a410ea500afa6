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
from pathlib import Path
from typing import Any

from orchestrator.shared.files import jsonl_line, open_append, read_jsonl

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
        self._fh = open_append(path)  # never through a link; closed in close()

    @property
    def seq(self) -> int:
        """Number of the last line written (0 for an empty file)."""
        return self._seq

    def write(self, record: dict[str, Any]) -> int:
        with self._lock:
            self._seq += 1
            self._fh.write(jsonl_line({"seq": self._seq, **record}, default=_json_default,
                                      ensure_ascii=True, separators=(",", ":")))
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
    for record in read_jsonl(path, tail_bytes=TAIL_BYTES):
        if record.get("decision") != "accepted":
            continue
        event = record.get("event")
        if isinstance(event, dict) and isinstance(event.get("id"), str):
            ids.append(event["id"])
    return ids


def read_log(path: Path, *, limit: int | None = None) -> list[dict[str, Any]]:
    """The records in the log's tail (``TAIL_BYTES``; the last ``limit`` if given); lines that
    are not records (a torn last line) are skipped."""
    out = list(read_jsonl(path, tail_bytes=TAIL_BYTES))
    return out[-limit:] if limit else out


def _last_seq(path: Path) -> int:
    seqs = [r["seq"] for r in read_jsonl(path, tail_bytes=TAIL_BYTES)
            if isinstance(r.get("seq"), int)]
    return max(seqs, default=0)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return raw_for_record(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)
