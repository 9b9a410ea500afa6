"""The run directory's inbox: the embedded local transport for operator events.

The CLI writes one JSON file per event by write-to-temp then rename (readers never see half a
file); the intake's watcher thread picks up ``*.json`` in name order and deletes a file only after
its event (or dead letter) is recorded. Names start with a nanosecond timestamp so order is the
publish order.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

INBOX_DIR = "inbox"


def inbox_path(run_dir: Path) -> Path:
    return Path(run_dir) / INBOX_DIR


def write_inbox(run_dir: Path, payload: bytes) -> Path:
    """Atomically drop ``payload`` into RUN_DIR/inbox; returns the final path."""
    inbox = inbox_path(run_dir)
    inbox.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    tmp = inbox / f".{name}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    final = inbox / name
    os.replace(tmp, final)
    return final


class InboxWatcher:
    """Polls the inbox directory; hands each new file to ``deliver(data, ack, name)``.

    ``ack`` deletes the file; until then the file is "in flight" and not delivered again.
    """

    def __init__(self, run_dir: Path, deliver: Callable[[bytes, Callable[[], None], str], None],
                 *, poll_s: float = 0.2, max_bytes: int = 1 << 20) -> None:
        self.dir = inbox_path(run_dir)
        self._deliver = deliver
        self._poll_s = poll_s
        self._max_bytes = max_bytes
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="events-inbox", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def scan_once(self) -> int:
        """Deliver every new file once; returns how many were delivered."""
        try:
            names = sorted(n for n in os.listdir(self.dir)
                           if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return 0
        delivered = 0
        for name in names:
            with self._lock:
                if name in self._in_flight:
                    continue
                self._in_flight.add(name)
            path = self.dir / name
            try:
                with open(path, "rb") as fh:
                    data = fh.read(self._max_bytes + 1)
            except FileNotFoundError:
                self._forget(name)
                continue
            except OSError as exc:
                log.warning("inbox_read_failed", file=str(path), error=str(exc))
                self._forget(name)
                continue
            self._deliver(data, self._acker(name), name)
            delivered += 1
        return delivered

    def _acker(self, name: str) -> Callable[[], None]:
        def ack() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / name)
            self._forget(name)
        return ack

    def _forget(self, name: str) -> None:
        with self._lock:
            self._in_flight.discard(name)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan_once()
            except Exception:  # the watcher must outlive any single bad file
                log.exception("inbox_scan_failed", dir=str(self.dir))
            self._stop.wait(self._poll_s)
