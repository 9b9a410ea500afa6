"""A real local Ray head with the job server, for autoresume tests (no `ray stop`: that would
kill other Ray clusters on the machine; we kill only our own process group and temp dir)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

from tests.support.pubsub_emulator import free_port

READY_TIMEOUT_S = 90.0


@contextlib.contextmanager
def ray_job_server(num_cpus: int = 2) -> Iterator[str]:
    """Yield the job API URL of a fresh `ray start --head` (RAY_AUTH_MODE=disabled)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="arr-", dir="/tmp"))
    dash = free_port()
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               PATH=f"{venv_bin}:{os.environ.get('PATH', '')}")  # `python` in jobs = this venv
    env.pop("RAY_ADDRESS", None)
    ray_bin = str(Path(sys.executable).parent / "ray")
    log = open(temp_dir / "head.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--port={free_port()}",
         f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
         f"--ray-client-server-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}", f"--num-cpus={num_cpus}", "--num-gpus=0",
         f"--temp-dir={temp_dir}", "--disable-usage-stats"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                tail = (temp_dir / "head.log").read_text()[-2000:]
                raise RuntimeError(f"ray start exited: {tail}")
            try:
                with urllib.request.urlopen(f"{url}/api/version", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("Ray job server did not come up")
            time.sleep(0.5)
        yield url
    finally:
        _kill_tree(proc, str(temp_dir))
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_tree(proc: subprocess.Popen[bytes], temp_dir: str) -> None:
    """SIGTERM our process group, then SIGKILL whatever of ours remains (by pid)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    ours = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if temp_dir in " ".join(p.info["cmdline"] or ()):
                ours.append(p)
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(ours, timeout=10)
