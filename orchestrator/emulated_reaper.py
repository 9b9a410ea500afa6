"""No process of an emulated cluster outlives the driver that started it, even a SIGKILLed one.

Ray ties the GCS and raylets it starts to their parent (``PR_SET_PDEATHSIG``), but not what a
raylet starts: after a ``kill -9`` of the driver every emulated node's dashboard agent and
runtime-env agent lived on, reparented to init, through later runs (issue 28, item 8). So:

* every process of the cluster carries ``TPU_ORCH_EMULATED_CLUSTER=<random id>`` in its
  environment (set only while the driver starts Ray nodes; Ray hands its environment down to
  every process a node starts), which tells exactly which processes are the cluster's;
* a reaper (``python -m orchestrator.emulated_reaper``, its own session) waits for the driver
  to die, or for the pipe the driver holds to close (a normal shutdown), and SIGKILLs every
  process of this user that carries the id;
* a record per cluster (``$TMPDIR/tpu-orchestrator-<uid>/emulated/<id>.json``) lets the next
  start clean what a dead driver left should its reaper have died with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

MARK_ENV = "TPU_ORCH_EMULATED_CLUSTER"
KILL_WITHIN_S = 10.0
"""How long the reaper keeps killing: a raylet being killed may still start a worker."""


def records_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"tpu-orchestrator-{os.getuid()}" / "emulated"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22):
    with the pid, it names one process even after the pid is reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def marked(marker: str) -> list[int]:
    """Live processes of this user whose environment carries ``marker`` (zombies excluded)."""
    needle = f"{MARK_ENV}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry))
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return found


def kill_marked(marker: str, *, within_s: float = KILL_WITHIN_S, spare: int | None = None
                ) -> int:
    """SIGKILL every process carrying ``marker`` (but ``spare``) until none is left or
    ``within_s`` passed; returns how many were killed."""
    killed: set[int] = set()
    until = time.monotonic() + within_s
    while True:
        alive = [p for p in marked(marker) if p != spare]
        if not alive or time.monotonic() > until:
            return len(killed)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.1)


@contextlib.contextmanager
def marking(marker: str) -> Iterator[None]:
    """Processes started inside carry ``marker`` (Ray copies ``os.environ`` into each)."""
    before = os.environ.get(MARK_ENV)
    os.environ[MARK_ENV] = marker
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MARK_ENV, None)
        else:
            os.environ[MARK_ENV] = before


class Reaper:
    """The reaper of one emulated cluster; ``start`` before its first node, ``stop`` after
    the cluster's own shutdown (what is left then is killed too)."""

    def __init__(self) -> None:
        self.marker = uuid.uuid4().hex
        self.proc: subprocess.Popen | None = None
        self.record = records_dir() / f"{self.marker}.json"

    def start(self) -> None:
        clean_leftovers()
        me = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.emulated_reaper", self.marker, str(me),
             str(start_time(me))], stdin=subprocess.PIPE, start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != MARK_ENV})
        self.record.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.record.write_text(json.dumps({"marker": self.marker, "driver_pid": me,
                                           "driver_start": start_time(me),
                                           "reaper_pid": self.proc.pid}))

    def stop(self, timeout_s: float = KILL_WITHIN_S + 5) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):  # a byte, not only EOF: a forked child may hold
            self.proc.stdin.write(b"stop")  # type: ignore[union-attr]  (the pipe's write end)
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None
        self.record.unlink(missing_ok=True)


def clean_leftovers() -> int:
    """Kill what emulated clusters of dead drivers left (their reaper died too), drop their
    records; returns how many processes were killed."""
    killed = 0
    for path in sorted(records_dir().glob("*.json")) if records_dir().is_dir() else []:
        try:
            rec = json.loads(path.read_text())
            pid, born = int(rec["driver_pid"]), rec["driver_start"]
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if start_time(pid) is not None and start_time(pid) == born:
            continue  # its driver still runs: its cluster is in use
        killed += kill_marked(str(rec["marker"]))
        path.unlink(missing_ok=True)
    return killed


def _driver_gone(pid: int, born: int | None) -> bool:
    return start_time(pid) is None or start_time(pid) != born


def watch(marker: str, driver_pid: int, driver_start: int | None) -> int:
    """The reaper's loop: until the driver dies or closes our stdin, then kill the cluster."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the driver's to handle
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(driver_pid)
    waits = [sys.stdin.fileno()] + ([pidfd] if pidfd is not None else [])
    while not _driver_gone(driver_pid, driver_start):
        ready, _, _ = select.select(waits, [], [], 1.0)
        if pidfd is not None and pidfd in ready:
            break
        if sys.stdin.fileno() in ready:
            break  # "stop" or EOF: the driver shut its cluster down (or died)
    kill_marked(marker, spare=driver_pid)
    (records_dir() / f"{marker}.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(watch(sys.argv[1], int(sys.argv[2]),
                   None if sys.argv[3] == "None" else int(sys.argv[3])))
