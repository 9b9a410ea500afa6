"""One driver per run directory: an exclusive ``flock`` on ``RUN_DIR/driver.lock``.

The kernel drops the lock when the holding process dies (kill -9 included), so a lock a dead
driver leaves behind never blocks a resume or an autoresume; the file only names the last holder
for the error message. ``flock`` is per machine: two drivers on one head node (``ray job
submit`` runs every driver there) are refused; on a bucket mounted on several machines the lock
does not reach across them (docs in README "Run directory").
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

import structlog

from orchestrator.shared.errors import OrchestratorError

LOCK_NAME = "driver.lock"
log = structlog.get_logger("orchestrator.driver.lock")


class RunDirBusy(OrchestratorError):
    """Another live driver holds this run directory."""

    def __init__(self, run_dir: Path, holder: dict) -> None:
        self.holder = holder
        who = ", ".join(f"{k} {holder[k]}" for k in ("pid", "host", "submission_id")
                        if holder.get(k)) or "an unknown process"
        since = holder.get("started_at")
        when = time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(
            since, (int, float)) else ""
        super().__init__(
            f"Run directory {run_dir} is in use by another driver ({who}{when}); two drivers "
            "would write the same checkpoints, metrics and summary.",
            fix=f"wait for that run to end or stop it (kill {holder.get('pid', 'its pid')} / "
                "`ray job stop`), or give this run another run.run_dir")


class RunDirLock:
    """Holds ``RUN_DIR/driver.lock`` for the driver's life; ``release`` is idempotent."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_NAME

    def acquire(self, *, submission_id: str | None = None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirBusy(self.run_dir, holder) from None
        except OSError as exc:  # a filesystem without locks (some FUSE mounts): say so, go on
            os.close(fd)
            log.warning("run_dir_lock_unsupported", path=str(self.path), error=str(exc),
                        consequence="a second driver on this run dir would not be refused")
            return
        except BaseException:
            os.close(fd)
            raise
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time(),
                "submission_id": submission_id}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no stale holder named after a clean exit
        finally:
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
