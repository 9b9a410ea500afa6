"""Child processes the benchmarks start, and their certain teardown (never a stray process).

Everything here tracks the processes it started by pid, and ends them with their descendants
(Ray's GCS, raylets and workers started by a killed driver included).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import structlog

log = structlog.get_logger(__name__)

ROOT = Path(__file__).resolve().parents[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every benchmark child: loopback only, no usage stats, no GCE probe."""
    env = dict(os.environ)
    env.update({"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9",
                "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def python_cmd(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _default_sigint() -> None:
    """Children of a background shell job inherit SIGINT ignored, and Python then never raises
    KeyboardInterrupt: give the child the default, so SIGINT stops a driver gracefully."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(cmd: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None
          ) -> subprocess.Popen:
    """Start ``cmd`` in its own session, stdout+stderr to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log_path, "ab")  # noqa: SIM115 - closed by the child's exit (inherited)
    try:
        return subprocess.Popen(list(cmd), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env or child_env(), start_new_session=True,
                                preexec_fn=_default_sigint)
    finally:
        fh.close()


def kill_tree(proc: subprocess.Popen | int, *, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to a process we started and to every descendant it has now."""
    pid = proc if isinstance(proc, int) else proc.pid
    try:
        root = psutil.Process(pid)
        victims = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        victims = []
    for p in victims:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(victims, timeout=10)


def reap_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the process group of a child we started in its own session
    (a driver that died leaves its Ray GCS and raylets behind, in its group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def interrupt_then_kill(proc: subprocess.Popen, *, grace_s: float) -> float:
    """SIGINT (the driver checkpoints nothing extra and shuts Ray down), SIGKILL after ``grace_s``.

    Returns seconds until the process was gone. Descendants left behind are killed either way.
    """
    t0 = time.perf_counter()
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        log.warning("driver_did_not_stop", pid=proc.pid, grace_s=grace_s)
        kill_tree(proc)
        proc.wait(timeout=30)
    gone = time.perf_counter() - t0
    reap_group(proc)
    for p in descendants:
        try:
            if p.is_running():
                kill_tree(p.pid)
        except psutil.NoSuchProcess:
            continue
    return gone


def wait_all(procs: Sequence[subprocess.Popen], *, timeout_s: float) -> list[int]:
    """Exit codes of ``procs``; on timeout every one of them is killed (with descendants)."""
    deadline = time.monotonic() + timeout_s
    codes: list[int] = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        for p in procs:
            kill_tree(p)
        raise TimeoutError(f"benchmark processes still running after {timeout_s:.0f}s; "
                           "killed them") from None
    return codes
