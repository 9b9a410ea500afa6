"""Append step records to RUN_DIR/metrics.jsonl, one JSON object per line (the report reads it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from orchestrator.metrics.records import StepRecord
from orchestrator.metrics.sink import MetricSink


class JsonlSink(MetricSink):
    """Line-buffered appends: a crash loses at most the line being written (readers skip it)."""

    name = "jsonl"

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = open(self._path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def on_step(self, rec: StepRecord) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(rec.to_dict(), allow_nan=True) + "\n")

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
