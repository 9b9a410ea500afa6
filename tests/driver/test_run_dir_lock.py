"""One driver per run dir: a live holder refuses a second driver (exit 2, named); a dead one
(kill -9) does not block the resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from orchestrator.driver.lock import RunDirBusy, RunDirLock
from orchestrator.main import EXIT_BAD_INPUT

HOLD = """
import sys, time
from orchestrator.driver.lock import RunDirLock
RunDirLock(sys.argv[1]).acquire(submission_id="holder-r0")
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """A separate process that holds tmp_path's run-dir lock until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_second_lock_is_refused_naming_the_holder(tmp_path, holder):
    with pytest.raises(RunDirBusy) as info:
        RunDirLock(tmp_path).acquire()
    assert info.value.holder["pid"] == holder.pid
    assert info.value.holder["submission_id"] == "holder-r0"
    assert f"kill {holder.pid}" in str(info.value) and "run.run_dir" in str(info.value)


def test_lock_of_a_killed_driver_does_not_block_a_resume(tmp_path, holder):
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    lock = RunDirLock(tmp_path)
    lock.acquire()  # the kernel dropped the dead holder's flock
    lock.release()


def test_release_frees_the_run_dir_in_process(tmp_path):
    first = RunDirLock(tmp_path)
    first.acquire()
    first.release()
    first.release()  # idempotent
    with RunDirLock(tmp_path):
        pass


def test_second_driver_exits_2_before_starting_anything(tmp_path, holder):
    """A real second ``python -m orchestrator.main`` on the held run dir: exit 2, the holder
    named, nothing of the run touched, no cluster started (it would take seconds and log it)."""
    out = subprocess.run([sys.executable, "-m", "orchestrator.main", f"run.run_dir={tmp_path}",
                          "cluster.mode=emulate"], capture_output=True, text=True, timeout=120)
    assert out.returncode == EXIT_BAD_INPUT, out.stderr[-2000:]
    assert "Run directory in use" in out.stderr and str(holder.pid) in out.stderr
    assert "emulated_cluster_started" not in out.stdout + out.stderr
    assert not (tmp_path / "run.json").exists()  # nothing of the holder's run was touched
