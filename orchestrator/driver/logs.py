"""structlog set-up: JSON lines Cloud Logging understands (``severity``), or a terminal that
reads like a tool (issue 32 item 7).

Every record is also kept as a JSON line in RUN_DIR/driver.log.jsonl once the run directory is
known (``attach_file``), so a terminal showing little loses nothing.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog

from orchestrator.shared.files import UnsafeFile, open_append

LOG_FILE = "driver.log.jsonl"
_EARLY_MAX = 2000  # records kept before the run directory is known


@dataclass(frozen=True)
class Output:
    """What the driver prints where: ``json`` records on stderr (else human lines, warnings and
    up only), a ``live`` progress display, and the workers' own lines (``worker_logs``: Gloo,
    XLA, prints; always in RUN_DIR/workers.log, their warnings always in the driver's log)."""

    json: bool
    live: bool
    worker_logs: bool


def choose_output(fmt: str | None, *, tty: bool, verbose: bool | None = None) -> Output:
    """auto: a TTY on stdout decides. Off a TTY (``ray job logs``, Cloud Logging): JSON records
    and progress lines. The workers' own lines only with ``verbose`` (issue 53 item 4: piped,
    they buried the run's output in Gloo's chatter, colour codes and all)."""
    fmt = fmt or "auto"
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"log format {fmt!r}: use auto, json or console")
    as_json = fmt == "json" or (fmt == "auto" and not tty)
    return Output(json=as_json, live=tty and not as_json,
                  worker_logs=bool(verbose))


def _severity(_, method_name: str, event_dict: dict) -> dict:
    level = event_dict.pop("level", method_name)
    event_dict["severity"] = {"warn": "WARNING", "exception": "ERROR"}.get(level, level.upper())
    return event_dict


class _Tee:
    """The final renderer and the logger in one: JSON to the run directory's file always, and to
    stderr either JSON (machines) or a human line for warnings and errors (people)."""

    def __init__(self, *, json_stream: bool) -> None:
        self.json_stream = json_stream
        self._human = structlog.dev.ConsoleRenderer(colors=False)
        self._file: IO[str] | None = None
        self._early: list[str] = []
        self._lock = threading.Lock()

    def render(self, _, method_name: str, event_dict: dict) -> tuple[tuple, dict]:
        human = None
        if not self.json_stream and method_name not in ("debug", "info"):
            human = self._human(None, method_name,
                                {k: v for k, v in event_dict.items() if k != "time"})
        ev = _severity(None, method_name, dict(event_dict))
        ev = structlog.processors.format_exc_info(None, method_name, ev)
        ev["message"] = ev.pop("event", "")
        return (json.dumps(ev, default=str), human), {}

    def attach_file(self, path: Path) -> None:
        """Append from now on to ``path``; ``UnsafeFile`` when a link or another file's name
        was planted there (bad input: the driver exits 2 before it writes anything else)."""
        with self._lock:
            if self._file is not None:  # another run directory in this process (tests)
                self._file.close()
                self._file = None
            try:
                self._file = open_append(path)
            except UnsafeFile:
                raise
            except OSError:
                return  # the terminal still has the records that matter
            self._file.write("".join(line + "\n" for line in self._early))
            self._file.flush()
            self._early.clear()

    def msg(self, line: str, human: str | None) -> None:
        shown = line if self.json_stream else human
        if shown is not None:  # sys.stderr now: rich may redirect it
            _write_line(sys.stderr, shown)
        with self._lock:
            if self._file is None:
                if len(self._early) < _EARLY_MAX:
                    self._early.append(line)
                return
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError):
                self._file = None

    def __call__(self, *_: Any) -> _Tee:  # structlog's logger_factory
        return self

    debug = info = warning = warn = error = critical = exception = fatal = msg


def _write_line(stream: IO[str], text: str) -> None:
    """One write per line: records logged from Ray's log thread and the main thread at once
    never garble each other (``print`` writes the text and its newline apart)."""
    stream.write(text + "\n")
    stream.flush()


_tee: _Tee | None = None


def configure(*, json_logs: bool, level: str = "info") -> None:
    """JSON to stderr for machines (Cloud Logging agent, ray job logs); at a terminal only
    warnings and errors, as readable lines (the rest is in RUN_DIR/driver.log.jsonl)."""
    global _tee
    lvl = getattr(logging, level.upper(), logging.INFO)
    _tee = _Tee(json_stream=json_logs)
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
        _tee.render,
    ]
    structlog.configure(processors=processors,
                        wrapper_class=structlog.make_filtering_bound_logger(lvl),
                        logger_factory=_tee, cache_logger_on_first_use=False)


def attach_run_dir(run_dir: Path) -> None:
    """From here every record is also a line of RUN_DIR/driver.log.jsonl (earlier ones too)."""
    if _tee is not None:
        _tee.attach_file(Path(run_dir) / LOG_FILE)
