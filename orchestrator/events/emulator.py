"""Google's Pub/Sub emulator on a loopback port, always torn down with its Java tree.

Used by the driver's embedded default (``events.pubsub.emulator: true`` when gcloud exists) and
by tests (``tests/support/pubsub_emulator.py`` adds pytest fixtures on top).
``gcloud beta emulators pubsub start`` runs a shell script that starts Java; we start it in its
own process group and kill the whole group, so no JVM outlives a test even if the test fails.
``restart_on`` of an ``EmulatorProcess`` stops and starts it on the same port (outage tests).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from orchestrator.shared.files import open_append
from orchestrator.shared.host_env import free_port

READY_TIMEOUT_S = 60.0


def gcloud_available() -> bool:
    return shutil.which("gcloud") is not None


class EmulatorProcess:
    """One emulator process group on a fixed loopback port (start/stop/restart)."""

    def __init__(self, port: int | None = None, *, data_dir: Path | None = None) -> None:
        self.port = port or free_port("127.0.0.1")
        self.host_port = f"127.0.0.1:{self.port}"
        self._own_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="pubsub-emu-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self.data_dir / "emulator.log"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        if not gcloud_available():
            raise RuntimeError("gcloud is not installed: the Pub/Sub emulator needs the "
                               "Google Cloud CLI (gcloud beta emulators pubsub)")
        log = open_append(self._log_path, binary=True)  # to the child; closed in stop()
        env = {k: v for k, v in os.environ.items() if k != "PUBSUB_EMULATOR_HOST"}
        env.setdefault("CLOUDSDK_CORE_DISABLE_PROMPTS", "1")
        self._proc = subprocess.Popen(
            ["gcloud", "beta", "emulators", "pubsub", "start",
             f"--host-port={self.host_port}", f"--data-dir={self.data_dir}", "--quiet"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )
        self._log = log
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.host_port

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.host_port}/"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"Pub/Sub emulator exited early: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"Pub/Sub emulator not ready on {self.host_port} after "
                           f"{timeout_s:g}s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the whole process group (gcloud wrapper + JVM) and wait for it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            # the JVM may linger briefly after the wrapper; make sure the group is gone
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            self._wait_port_free()
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None

    def _wait_port_free(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.1)

    def restart(self) -> str:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


@contextlib.contextmanager
def pubsub_emulator(port: int | None = None) -> Iterator[str]:
    """Yield ``127.0.0.1:PORT`` of a running emulator; always kill it afterwards."""
    emulator = EmulatorProcess(port)
    try:
        yield emulator.start()
    finally:
        emulator.close()


@contextlib.contextmanager
def emulator_process(port: int | None = None) -> Iterator[EmulatorProcess]:
    """Like ``pubsub_emulator`` but yields the process object (for stop/restart in tests)."""
    emulator = EmulatorProcess(port)
    try:
        emulator.start()
        yield emulator
    finally:
        emulator.close()
