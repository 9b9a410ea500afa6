"""Where the Ray workers' own output goes (issue 53 items 3, 4).

Ray used to print every line of every host on the driver's stdout and stderr (colour codes, its
dedup notices, Gloo's and XLA's chatter, after the summary too), and only off a terminal: a
warning a user must see ("the data is shorter than the run") was lost at a terminal and
buried when piped. ``WorkerOutput`` takes Ray's place (``ray_private.route_worker_output``):

- every line goes to RUN_DIR/workers.log, colour codes stripped, named by its process;
- a host's warning or error (a line ``orchestrator.shared.worker_log`` marked) becomes a
  driver log record, so it reaches the terminal (above the progress bar) and
  RUN_DIR/driver.log.jsonl whatever the output format, once however many hosts say it;
- the lines themselves reach the terminal only with ``logs.verbose=true``, and never after
  ``quiet`` (the summary is the driver's last output).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import structlog

from orchestrator.shared.files import UnsafeFile, open_append
from orchestrator.shared.worker_log import parse

log = structlog.get_logger("orchestrator.workers")

WORKERS_LOG = "workers.log"
_EARLY_MAX = 5000  # lines kept before the run directory is known
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
LIBRARIES = ("absl", "jax", "jaxlib", "flax", "optax", "orbax", "ray", "tensorstore", "etils",
             "urllib3", "asyncio", "grpc")
"""Loggers whose warnings stay in workers.log: the libraries' own notes, not the run's or the
task's (shown with ``logs.verbose=true``)."""


def strip_ansi(text: str) -> str:
    """Colour codes are for a terminal Ray believed it had; a file or a pipe gets the text."""
    return ANSI.sub("", text)


def source_of(data: Mapping[str, Any]) -> str:
    """Which process a batch of Ray's came from, e.g. ``HostActor pid=4242 ip=10.0.0.2``."""
    name = data.get("actor_name") or data.get("task_name") or ""
    where = f"pid={data.get('pid')}"
    if data.get("ip") and data.get("ip") != data.get("localhost"):
        where += f" ip={data.get('ip')}"
    return f"{name} {where}".strip()


def must_show(record: Mapping[str, Any]) -> bool:
    """A warning or error of the run's own code or of the user's task; a library's note is not
    one (it stays in workers.log)."""
    level = logging.getLevelName(str(record.get("level", "")))
    logger = str(record.get("logger", ""))
    library = logger.split(".", 1)[0] in LIBRARIES
    return isinstance(level, int) and level >= logging.WARNING and not library


def readable(record: Mapping[str, Any]) -> str:
    """A marked record as a person reads it in workers.log: ``WARNING logger: message``."""
    exc = f"\n{record['exc']}" if record.get("exc") else ""
    return f"{record.get('level')} {record.get('logger')}: {record['message']}{exc}"


def report(record: Mapping[str, Any], source: str) -> None:
    """A worker's record (``must_show``) as the driver's own: on the terminal and in
    RUN_DIR/driver.log.jsonl. ``source`` names the process (a host, the task check)."""
    error = logging.getLevelName(str(record.get("level"))) >= logging.ERROR
    fields = {"text": record["message"], "origin": record.get("logger"), "host": source}
    if record.get("exc"):
        fields["exc"] = record["exc"]
    (log.error if error else log.warning)(
        "worker_error" if error else "worker_warning", **fields)


def _stream(is_err: bool) -> IO[str]:
    """Looked up at each line: rich's live display redirects both while it runs."""
    return sys.stderr if is_err else sys.stdout


class WorkerOutput:
    """Ray's handler for the workers' lines (``__call__``, on Ray's log thread): see the module
    docstring. ``echo``: print the lines too (``logs.verbose``)."""

    def __init__(self, *, echo: bool, stream: Callable[[bool], IO[str]] = _stream) -> None:
        self._echo = echo
        self._stream = stream
        self._file: IO[str] | None = None
        self.path: Path | None = None
        """Where the lines are kept (``attach``)."""
        self._early: list[str] = []
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, data: Mapping[str, Any]) -> None:
        try:
            self._batch(data)
        except Exception as exc:  # Ray's log thread ends for good on an exception
            log.debug("worker_output_failed", error=str(exc))

    def _batch(self, data: Mapping[str, Any]) -> None:
        source, is_err = source_of(data), bool(data.get("is_err"))
        for raw in data.get("lines") or ():
            line = strip_ansi(str(raw)).rstrip("\n")
            record = parse(line)
            if record is not None:
                line = readable(record)
                if must_show(record):
                    self._warn_once(record, source)
            self._keep(f"({source}) {line}")
            if self._echo:
                self._print(is_err, f"({source}) {line}")

    def show(self, record: Mapping[str, Any], source: str) -> None:
        """A record of another process of the run's (the task check's) shown as a host's: the
        same warning from the hosts later is not shown again."""
        self._warn_once(record, source)

    def _warn_once(self, record: Mapping[str, Any], source: str) -> None:
        """A driver record; the same message from every host of the group is shown once."""
        key = (str(record.get("logger")), str(record["message"]))
        if key in self._seen:
            return
        self._seen.add(key)
        report(record, source)

    def _print(self, is_err: bool, line: str) -> None:
        with self._lock:
            if not self._echo:
                return
            out = self._stream(is_err)
            out.write(line + "\n")  # one write: lines of two threads never interleave
            out.flush()

    def _keep(self, line: str) -> None:
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

    def attach(self, path: Path) -> None:
        """Keep the lines in ``path`` from now on (earlier ones too); ``UnsafeFile`` when a link
        was planted there, as for driver.log.jsonl."""
        with self._lock:
            if self._file is not None:
                self._file.close()
            try:
                self._file = open_append(path)
            except UnsafeFile:
                self._file = None
                raise
            except OSError:
                self._file = None
                return  # the warnings still reach the driver's log
            self.path = path
            self._file.write("".join(line + "\n" for line in self._early))
            self._file.flush()
            self._early.clear()

    def quiet(self) -> None:
        """No line on the terminal from now on (the summary follows): the file keeps them."""
        with self._lock:
            self._echo = False

    def note(self) -> str | None:
        """The line naming the file, printed before the summary (None: no file)."""
        if self.path is None:
            return None
        return f"Workers' own output (Gloo, XLA, JAX, prints): {self.path}"

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
