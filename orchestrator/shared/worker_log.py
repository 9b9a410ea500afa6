"""A host's log records, as lines its driver can tell apart from the rest of the host's output.

A host process's stderr also carries Gloo, XLA's C++ logging, JAX's and Ray's own lines; a
warning from Python's ``logging`` arrived there as a bare message (``logging.lastResort``), or
formatted by whichever library installed a handler first, and the driver could not know it
from chatter (issue 53 items 3, 4). Each record at ``WARNING`` or above is therefore also
written as one marked line, ``MARKER`` + JSON (``install``, run by the host at its start:
``workers/host/warm.py: apply_env``); the driver (``orchestrator/driver/worker_output.py``) turns
those into its own log records and keeps the other lines in RUN_DIR/workers.log.
Standard library only: both sides import it.
"""

from __future__ import annotations

import json
import logging
import sys

MARKER = "ORCH_LOG "
"""Starts the line of a host's log record (the driver's ``parse``)."""


class RecordHandler(logging.Handler):
    """One marked JSON line per record on this process's stderr (looked up at each record, as
    ``logging.lastResort`` does: Ray swaps ``sys.stderr`` in its workers)."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(format_record(record) + "\n")
            sys.stderr.flush()
        except Exception:  # a log line must never fail the host's work
            self.handleError(record)


def format_record(record: logging.LogRecord) -> str:
    """``MARKER`` + the record's level, logger, message (and traceback) as one JSON line."""
    out = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return MARKER + json.dumps(out, default=str)


def install(root: logging.Logger | None = None) -> RecordHandler:
    """Add the handler to the root logger once (a host's ``rejoin`` runs this again)."""
    root = root or logging.getLogger()
    for h in root.handlers:
        if isinstance(h, RecordHandler):
            return h
    handler = RecordHandler()
    root.addHandler(handler)
    return handler


def parse(line: str) -> dict | None:
    """A host's log record from one line of its output; None for any other line."""
    at = line.find(MARKER)  # after Ray's "(HostActor pid=…)" prefix, if one is kept
    if at < 0:
        return None
    try:
        rec = json.loads(line[at + len(MARKER):])
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("message"), str):
        return None
    return rec
