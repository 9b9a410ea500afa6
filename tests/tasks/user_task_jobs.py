"""The user-task cluster tests' local job API and process probes (kept apart from the tests)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from orchestrator.autoresume.resume_only import RecordedCommand
from policies.autoresume import JobStatus, Submission, restart_of

REPO = Path(__file__).resolve().parents[2]


class LocalJobs:
    """Ray's job API for the autoresume service, as local processes: ``submit`` runs the
    entrypoint (with RAY_ADDRESS, as Ray sets it for a job), ``status`` says RUNNING while it
    lives, SUCCEEDED on exit 0, FAILED otherwise (a SIGKILLed driver's job FAILS)."""

    def __init__(self, address: str, log_dir: Path) -> None:
        self.address, self.log_dir = address, log_dir
        self.jobs: dict[str, tuple[subprocess.Popen, float]] = {}
        self.commands: dict[str, RecordedCommand] = {}  # what each job ran, as Ray records it

    def submit(self, *, submission_id: str, entrypoint: str, runtime_env: Mapping[str, Any],
               metadata: Mapping[str, str]) -> None:
        env = {**os.environ, **(runtime_env.get("env_vars") or {}), "RAY_ADDRESS": self.address,
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               "PYTHONUNBUFFERED": "1"}
        log = (self.log_dir / f"{submission_id}.log").open("ab")
        proc = subprocess.Popen(shlex.split(entrypoint), cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.jobs[submission_id] = (proc, time.time())
        self.commands[submission_id] = RecordedCommand(
            submission_id=submission_id, entrypoint=entrypoint, runtime_env=dict(runtime_env))

    def command(self, submission_id: str) -> RecordedCommand | None:
        return self.commands.get(submission_id)

    def status(self, submission_id: str) -> JobStatus:
        proc = self.jobs[submission_id][0]
        code = proc.poll()
        if code is None:
            return JobStatus.RUNNING
        return JobStatus.SUCCEEDED if code == 0 else JobStatus.FAILED

    def run_submissions(self, run_id: str, recorded_ids: tuple[str, ...] = (),
                        entrypoint: Sequence[str] = ()) -> tuple[Submission, ...]:
        return tuple(Submission(submission_id=sid, status=self.status(sid), start_time=t0)
                     for sid, (_, t0) in self.jobs.items()
                     if sid == run_id or restart_of(run_id, sid) is not None)

    def stop(self, submission_id: str) -> None:
        self.jobs[submission_id][0].terminate()

    def log(self, submission_id: str) -> str:
        return (self.log_dir / f"{submission_id}.log").read_text()[-4000:]




def wait_for(pred, timeout_s: float, what: str, *, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


def host_pids() -> set[int]:
    """Pids of the cluster's live host actors, from Ray's actor table (only the driver under
    test has any: the in-process runs before closed theirs)."""
    from ray._private import state

    return {int(a["Pid"]) for a in state.actors(actor_state_name="ALIVE").values()
            if a["ActorClassName"] == "HostActor"}


def all_gone(pids: set[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True
