"""The run directory's inbox: the embedded local transport for operator events.

The CLI writes one JSON file per event by write-to-temp then rename (readers never see half a
file); the intake's watcher thread picks up ``*.json`` in name order and deletes a file only after
its event (or dead letter) is recorded. Names start with a nanosecond timestamp so order is the
publish order.

The inbox is a control channel (stop, drain), so only the run's own user may use it: a file
owned by anyone else, a symbolic link, or any file while the inbox folder is writable by others
(group or world) or owned by someone else, is refused before it is parsed — logged with the
reason, recorded as a dead letter once, and left in place (nothing is deleted that is not ours).
Only the first ``MAX_REFUSALS_RECORDED`` refusals of a watcher are logged and dead-lettered, then
one line says the rest are refused unrecorded: a writer who drops thousands of files fills no disk.
Ownership cannot stop writers on a shared bucket mount (every file looks like the mount's), so
the inbox is off by default where Pub/Sub is configured (``EventsConfig.inbox_on``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import structlog

from orchestrator.shared.files import atomic_write_bytes

log = structlog.get_logger(__name__)

INBOX_DIR = "inbox"
MAX_REFUSALS_RECORDED = 100
PUBLISH_FIX = ("publish as the run's own user (`python -m orchestrator.events publish --run-dir "
               "RUN_DIR`), or through Pub/Sub")


def inbox_path(run_dir: Path) -> Path:
    return Path(run_dir) / INBOX_DIR


def write_inbox(run_dir: Path, payload: bytes) -> Path:
    """Atomically drop ``payload`` into RUN_DIR/inbox; returns the final path."""
    inbox = inbox_path(run_dir)
    inbox.mkdir(mode=0o755, parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    final = inbox / name
    atomic_write_bytes(final, payload, fsync=True)
    return final


def _owner(path: Path, st: os.stat_result) -> int:
    return st.st_uid


class InboxWatcher:
    """Polls the inbox directory; hands each new file to ``deliver(data, ack, name)``.

    ``ack`` deletes the file; until then the file is "in flight" and not delivered again. A file
    the run's user did not write (module docstring) goes to ``refuse(data, reason, name)``
    instead, once, and stays where it is.
    """

    owner_of: Callable[[Path, os.stat_result], int] = staticmethod(_owner)
    """Seam: the uid that owns ``path`` (tests run as one user and simulate another)."""

    def __init__(self, run_dir: Path, deliver: Callable[[bytes, Callable[[], None], str], None],
                 *, refuse: Callable[[bytes, str, str], None] | None = None,
                 poll_s: float = 0.2, max_bytes: int = 1 << 20) -> None:
        self.dir = inbox_path(run_dir)
        self.uid = os.geteuid()
        """The run's user: the only one whose files are taken."""
        self._deliver = deliver
        self._refuse = refuse
        self._poll_s = poll_s
        self._max_bytes = max_bytes
        self._refused: set[str] = set()
        self.refusals = 0
        """Files refused so far (all of them, recorded or not)."""
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
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
        folder = self._folder_problem() if names else None
        delivered = 0
        for name in names:
            with self._lock:
                if name in self._in_flight or name in self._refused:
                    continue
                self._in_flight.add(name)
            path = self.dir / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                self._forget(name)
                continue
            except OSError as exc:
                if os.path.islink(path):
                    self._reject(name, b"", f"{name} is a symbolic link")
                else:
                    log.warning("inbox_read_failed", file=str(path), error=str(exc))
                    self._forget(name)
                continue
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                regular = stat.S_ISREG(st.st_mode)
                data = fh.read(self._max_bytes + 1) if regular else b""
            problem = folder or (None if regular else f"{name} is not a regular file")
            if problem is None and (owner := self.owner_of(path, st)) != self.uid:
                problem = f"{name} is owned by uid {owner}, not by the run's user ({self.uid})"
            if problem is not None:
                self._reject(name, data, problem)
                continue
            self._deliver(data, self._acker(name), name)
            delivered += 1
        return delivered

    def _folder_problem(self) -> str | None:
        """Why no file of the inbox folder may be taken, or None."""
        try:
            st = os.stat(self.dir)
        except OSError as exc:
            return f"the inbox {self.dir} cannot be inspected ({exc.strerror})"
        mode = stat.S_IMODE(st.st_mode)
        if (owner := self.owner_of(self.dir, st)) != self.uid:
            return (f"the inbox {self.dir} is owned by uid {owner}, not by the run's user "
                    f"({self.uid}); fix: remove it (the next publish re-creates it)")
        if mode & 0o022:
            return (f"the inbox {self.dir} is writable by others (mode {mode:04o}); fix: chmod "
                    f"go-w {self.dir}")
        return None

    def _reject(self, name: str, data: bytes, reason: str) -> None:
        """Refuse ``name`` once: log, hand to ``refuse`` (a dead letter), leave the file."""
        with self._lock:
            self._refused.add(name)
            self._in_flight.discard(name)
            self.refusals += 1
            count = self.refusals
        if count > MAX_REFUSALS_RECORDED:
            if count == MAX_REFUSALS_RECORDED + 1:
                log.warning("inbox_refusals_capped", dir=str(self.dir),
                            recorded=MAX_REFUSALS_RECORDED, reason=reason,
                            fix=f"find who writes {self.dir} and remove the files not yours; "
                                "further refused files are neither logged nor dead-lettered")
            return
        log.warning("inbox_file_refused", file=str(self.dir / name), reason=reason,
                    fix=PUBLISH_FIX)
        if self._refuse is not None:
            self._refuse(data, f"refused, left in the inbox: {reason}", name)

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
