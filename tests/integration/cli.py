"""Run ``python -m orchestrator.main`` as a user does, and find whatever it left running.

Every run gets a unique marker in its environment; Ray's processes (GCS, raylets, workers,
host actors) inherit it, so after exit ``/proc`` tells exactly which of THIS run's processes
survive. Survivors are reported (the test fails) and then killed by pid.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from orchestrator.shared.procfs import stat_fields

REPO = Path(__file__).resolve().parents[2]
MARK = "TPU_ORCH_TEST_RUN"


@dataclass(frozen=True)
class MainResult:
    code: int
    stdout: str
    stderr: str
    seconds: float
    leftovers: tuple[str, ...]
    """Command lines of processes of this run still alive after the grace period."""


def _env(marker: str) -> dict[str, str]:
    env = {**os.environ, MARK: marker, "RAY_USAGE_STATS_ENABLED": "0", "NO_GCE_CHECK": "true",
           "GCE_METADATA_HOST": "127.0.0.1:9", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return env


def start_main(args: list[str], *, log_path: Path) -> tuple[subprocess.Popen, str]:
    """The driver in the background (its own session, output to ``log_path``) and its run's
    marker (for ``marked_pids``); the caller ends it."""
    marker = uuid.uuid4().hex
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.main", "--log-format",
                                 "json", *args], cwd=REPO, env=_env(marker), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return proc, marker


def run_main(args: list[str], *, timeout_s: float = 420.0, grace_s: float = 30.0) -> MainResult:
    marker = uuid.uuid4().hex
    env = _env(marker)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "orchestrator.main", "--log-format", "json",
                               *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -999, _text(exc.stdout), _text(exc.stderr) + "\n<timed out>"
    seconds = time.monotonic() - t0
    leftovers = _survivors(marker, grace_s)
    return MainResult(code=code, stdout=out, stderr=err, seconds=seconds, leftovers=leftovers)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def marked_pids(marker: str) -> dict[int, str]:
    """Live processes whose environment carries this run's marker."""
    needle = f"{MARK}={marker}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            if needle in environ.split(b"\0"):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                found[int(entry)] = cmd.decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _survivors(marker: str, grace_s: float) -> tuple[str, ...]:
    """Wait up to ``grace_s`` for the run's processes to exit; kill and report the rest."""
    deadline = time.monotonic() + grace_s
    alive = marked_pids(marker)
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = marked_pids(marker)
    found = tuple(f"{pid}: {cmd[:200]}{_state(pid)}" for pid, cmd in sorted(alive.items()))
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return found


def _state(pid: int) -> str:
    """`` (state S, parent 1)``: enough to tell an orphan from a process still in Ray's hands."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 2:
        return ""
    return f" (state {fields[0]}, parent {fields[1]})"


def snapshot(directory: Path) -> dict[str, tuple[str, int, int]]:
    """{relative path: (sha256, size, mtime_ns)} of every file below ``directory``."""
    out: dict[str, tuple[str, int, int]] = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(directory))] = (hashlib.sha256(p.read_bytes()).hexdigest(),
                                                  st.st_size, st.st_mtime_ns)
        elif p.is_dir():
            out[str(p.relative_to(directory)) + "/"] = ("dir", 0, 0)
    return out


def newest_step(run_dir: Path) -> int:
    """The newest step in RUN_DIR/metrics.jsonl (0 before any; a line being written is skipped)."""
    path = run_dir / "metrics.jsonl"
    steps = [0]
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            continue
    return max(steps)
