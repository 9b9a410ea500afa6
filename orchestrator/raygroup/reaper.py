"""No process of an emulated cluster outlives the driver that started it, even a SIGKILLed one.

Ray ties the GCS and raylets it starts to their parent (``PR_SET_PDEATHSIG``), but not what a
raylet starts: after a ``kill -9`` of the driver every emulated node's dashboard agent and
runtime-env agent lived on, reparented to init, through later runs (issue 28, item 8). So:

* the processes a node starts carry ``TPU_ORCH_EMULATED_CLUSTER=<random id>`` in their
  environment (set only while the driver starts Ray nodes), and the cluster is those and
  their descendants: a raylet hands the agents it starts only part of its environment (which
  variables it drops changes from start to start, measured), so the mark alone misses some;
* a reaper (``python -m orchestrator.raygroup.reaper``, its own session) notes the cluster's
  processes every second while the driver lives (an orphan loses its parent), and when the
  driver dies (its pidfd) or shuts the cluster down (the pipe it holds) SIGKILLs all of them;
* a record per cluster (``$TMPDIR/tpu-orchestrator-<uid>/emulated/<id>.json``) lets the next
  start clean what a dead driver left should its reaper have died with it (the marked
  processes and their descendants: an orphaned agent that lost the mark is beyond it).
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

from orchestrator.shared.files import atomic_write_text
from orchestrator.shared.procfs import stat_fields

MARK_ENV = "TPU_ORCH_EMULATED_CLUSTER"
KILL_WITHIN_S = 10.0
"""How long the reaper keeps killing: a raylet being killed may still start a worker."""
SNAPSHOT_S = 1.0
"""How often the reaper notes the cluster's processes while the driver lives (a /proc scan;
only new processes' environments are read)."""


def records_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"tpu-orchestrator-{os.getuid()}" / "emulated"


def _state_and_start(pid: int) -> tuple[str, int] | None:
    """``/proc/<pid>/stat``'s state (field 3) and start time (field 22); None once gone."""
    fields = stat_fields(pid)
    try:
        return None if fields is None else (fields[0], int(fields[19]))
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, it names one process
    even after the pid is reused."""
    found = _state_and_start(pid)
    return None if found is None else found[1]


def _running(pid: int, born: int) -> bool:
    """The process ``pid`` started at ``born`` runs still: a zombie has exited (only its parent's
    wait is missing), so it is not waited for either."""
    found = _state_and_start(pid)
    return found is not None and found[1] == born and found[0] != "Z"


def _table() -> dict[int, tuple[int, int, str]]:
    """This user's live processes (zombies excluded): pid -> (parent pid, start time, state)."""
    out: dict[int, tuple[int, int, str]] = {}
    uid = os.getuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            fields = stat_fields(entry)
            if fields is not None and fields[0] != "Z":
                out[int(entry)] = (int(fields[1]), int(fields[19]), fields[0])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return out


def marked(marker: str, table: dict[int, tuple[int, int, str]] | None = None,
           seen: dict[tuple[int, int], bool] | None = None) -> list[int]:
    """Live processes of this user whose environment carries ``marker`` (zombies excluded).
    ``seen`` caches the answer per (pid, start time): a process's environment never changes
    (a repeated scan then reads only new processes')."""
    needle = f"{MARK_ENV}={marker}".encode()
    table = table if table is not None else _table()
    cache = seen if seen is not None else {}
    found = []
    for pid, (_, born, _) in table.items():
        key = (pid, born)
        if key not in cache:
            try:
                cache[key] = needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile, or not ours to read
                continue
        if cache[key]:
            found.append(pid)
    if seen is not None:  # forget processes that are gone
        for key in [k for k in seen if k[0] not in table or table[k[0]][1] != k[1]]:
            del seen[key]
    return found


def cluster(marker: str, seen: dict[tuple[int, int], bool] | None = None) -> dict[int, int]:
    """The cluster's processes now, pid -> start time: those carrying ``marker`` and their
    descendants. Ray does not hand a raylet's whole environment to the agents it starts (which
    variables it drops varies from start to start), so the mark alone misses some."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), marked(marker, table, seen)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return {pid: table[pid][1] for pid in found}


def kill_cluster(marker: str, *, known: dict[int, int] | None = None,
                 within_s: float = KILL_WITHIN_S, spare: int | None = None) -> int:
    """SIGKILL the cluster's processes (``cluster``, and those of ``known``, pid -> start
    time, still running: seen earlier, orphaned since) but ``spare`` until none is left or
    ``within_s`` passed; returns how many were killed."""
    killed: set[int] = set()
    until = time.monotonic() + within_s
    while True:
        alive = {**{p: t for p, t in (known or {}).items() if _running(p, t)},
                 **cluster(marker)}
        alive.pop(spare, None)  # type: ignore[arg-type]
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
            [sys.executable, "-m", "orchestrator.raygroup.reaper", self.marker, str(me),
             str(start_time(me))], stdin=subprocess.PIPE, start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != MARK_ENV})
        self.record.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_text(self.record, json.dumps({"marker": self.marker, "driver_pid": me,
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
        killed += kill_cluster(str(rec["marker"]))
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
    known: dict[int, int] = {}  # the cluster as last seen: its orphans lose their parent
    seen: dict[tuple[int, int], bool] = {}
    while not _driver_gone(driver_pid, driver_start):
        known = {p: t for p, t in known.items() if start_time(p) == t}
        known.update(cluster(marker, seen))
        ready, _, _ = select.select(waits, [], [], SNAPSHOT_S)
        if pidfd is not None and pidfd in ready:
            break
        if sys.stdin.fileno() in ready:
            break  # "stop" or EOF: the driver shut its cluster down (or died)
    kill_cluster(marker, known=known, spare=driver_pid)
    (records_dir() / f"{marker}.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(watch(sys.argv[1], int(sys.argv[2]),
                   None if sys.argv[3] == "None" else int(sys.argv[3])))
