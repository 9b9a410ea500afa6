"""Append step records to RUN_DIR/metrics.jsonl, one JSON object per line (the report reads it),
and eval records (``"kind": "eval"``, ``EvalRecord.to_dict``), which step-record readers skip.

Lines are buffered and written out at least every ``flush_every_s`` seconds (and on flush/close):
a write per step costs a system call per step on the driver, and a crash then loses at most that
long a tail, which the next incarnation's steps replace anyway. Readers skip a half-written line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from orchestrator.controller.listener import RunListener
from orchestrator.controller.records import EvalRecord, StepRecord
from orchestrator.shared.files import open_append


class JsonlSink(RunListener):
    """Buffered appends to one JSONL file."""

    name = "jsonl"

    def __init__(self, path: Path, *, flush_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = open_append(self._path)  # never through a link
        self._flush_every_s = flush_every_s
        self._clock = clock
        self._last_flush = clock()

    def on_step(self, rec: StepRecord) -> None:
        self._line(rec.to_dict())

    def on_eval(self, rec: EvalRecord) -> None:
        self._line(rec.to_dict())

    def _line(self, row: dict) -> None:
        if self._fh is None:
            return
        self._fh.write(json.dumps(row, allow_nan=True) + "\n")
        now = self._clock()
        if now - self._last_flush >= self._flush_every_s:
            self._fh.flush()
            self._last_flush = now

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            self._last_flush = self._clock()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
