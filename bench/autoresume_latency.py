"""Measure alert publish -> resubmission accepted -> job RUNNING, locally, as production runs it.

    .venv/bin/python bench/autoresume_latency.py --repeats 3

The parts are the real ones: Google's Pub/Sub emulator, and a local Ray cluster with token auth
on (`ray start --head` plus two worker nodes labelled as one TPU slice, from
tests/autoresume/ray_server.py); the autoresume service pulls with the real Pub/Sub client and
submits through the real JobSubmissionClient with the cluster's token.

Each repeat: a run whose first submission ``<run>-r0`` is the real driver (``python -m
orchestrator.main`` with a tiny config, what the allow-list accepts), killed (SIGKILL: the job
FAILS; a `ray job stop` would mean "do not resume") once it has written its own run.json, so the
command run.json records is the one Ray recorded (autoresume resubmits nothing else:
``orchestrator/autoresume/resume_only.py``); publish a real-format alert notification; time
until the service has submitted ``<run>-r1`` and until Ray reports it RUNNING (the resubmitted
driver then trains on the TPU-labelled nodes; it is stopped once measured). Starts and always
stops its own emulator and Ray nodes (no `ray stop`). Prints one line per repeat and the medians;
exits 1 when a repeat fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")

from orchestrator.autoresume.ray_jobs import RUN_ID_METADATA
from orchestrator.autoresume.service import AutoresumeService
from tests.autoresume.notifications import encode, notification
from tests.autoresume.ray_server import RayCluster, TpuSlices, ray_cluster
from tests.autoresume.service_harness import running_service
from tests.support.pubsub_emulator import pubsub_emulator

PROJECT = "demo-project"  # the notifications' scoping project (OriginConfig.project)
TPU = TpuSlices(slices=1, hosts_per_slice=2, devices_per_host=2)
TINY = ["run.total_steps=1000", "cluster.mode=auto",
        f"cluster.emulate.slices={TPU.slices}",
        f"cluster.emulate.hosts_per_slice={TPU.hosts_per_slice}",
        f"cluster.emulate.devices_per_host={TPU.devices_per_host}",
        "metrics.cloud_monitoring.enabled=false"]
RUNTIME_ENV = {"env_vars": {"JAX_PLATFORMS": "cpu"}}


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``pred`` until truthy; a job API hiccup (RuntimeError, e.g. a 500 under load) is
    asked again."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = pred()
        except RuntimeError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def driver_argv(run_id: str, run_dir: Path) -> list[str]:
    """The run's real entrypoint: what the driver writes to run.json and autoresume resubmits."""
    return ["python", "-m", "orchestrator.main", f"run.name={run_id}", f"run.run_dir={run_dir}",
            *TINY]


def recorded_by(run_dir: Path, submission: str) -> bool:
    """The driver of ``submission`` has written run.json (its command, as Ray recorded it)."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):  # not written yet
        return False
    return meta.get("ray_job_submission_id") == submission


def kill_first_driver(client: Any, run_id: str, run_dir: Path) -> None:
    """Submit ``<run>-r0`` as the run's real driver and kill it (SIGKILL: FAILED) once it has
    recorded itself in run.json: autoresume resubmits only the command Ray recorded."""
    from ray.job_submission import JobStatus

    first = client.submit_job(entrypoint=shlex.join(driver_argv(run_id, run_dir)),
                              submission_id=f"{run_id}-r0", runtime_env=RUNTIME_ENV,
                              metadata={RUN_ID_METADATA: run_id})
    wait_for(lambda: recorded_by(run_dir, first) or client.get_job_status(first).is_terminal(),
             180, f"{first} to write run.json")
    if not recorded_by(run_dir, first):
        raise RuntimeError(f"{first} ended {client.get_job_status(first)} before it wrote "
                           f"run.json:\n{client.get_job_logs(first)[-2000:]}")
    os.kill(int(client.get_job_info(first).driver_info.pid), signal.SIGKILL)
    wait_for(lambda: client.get_job_status(first).is_terminal(), 120, f"{first} to end")
    if client.get_job_status(first) != JobStatus.FAILED:
        raise RuntimeError(f"{first} ended {client.get_job_status(first)}, expected FAILED")


def one_repeat(client: Any, service: AutoresumeService, publisher: Any, topic: str,
               runs: Path) -> tuple[float, float]:
    """(publish -> submitted, publish -> RUNNING) seconds for one freshly failed run."""
    from ray.job_submission import JobStatus

    run_id = f"bench-{uuid.uuid4().hex[:6]}"
    kill_first_driver(client, run_id, runs / run_id)
    second = f"{run_id}-r1"
    t0, t0_wall = time.monotonic(), time.time()
    publisher.publish(topic, encode(notification(
        incident_id=f"inc-{run_id}", run_id=run_id, started_at=int(time.time())))
    ).result(timeout=30)

    def status() -> Any:
        try:
            return client.get_job_status(second)
        except RuntimeError:  # not submitted yet
            return None

    def running_or_ended() -> Any:
        now = status()
        return now if now == JobStatus.RUNNING or (now is not None and now.is_terminal()) \
            else None

    try:
        final = wait_for(running_or_ended, 180, f"{second} RUNNING")
        running = time.monotonic() - t0
        if final != JobStatus.RUNNING:
            raise RuntimeError(f"{second} was {final} before it was seen RUNNING:\n"
                               f"{client.get_job_logs(second)[-2000:]}")
    finally:
        if status() is not None:
            client.stop_job(second)  # measured; the run need not train to the end
            wait_for(lambda: client.get_job_status(second).is_terminal(), 120, f"{second} end")
    submitted = [a["at"] for a in service.audit.read()
                 if a.get("run_id") == run_id and a.get("outcome") == "submitted"]
    if len(submitted) != 1:
        raise RuntimeError(f"expected one submission for {run_id}, audit: {service.audit.read()}")
    return submitted[0] - t0_wall, running


def measure(cluster: RayCluster, repeats: int, tmp: Path,
            progress: Callable[[str], None] = print) -> tuple[list[float], list[float]]:
    """``repeats`` x (publish -> submitted, publish -> RUNNING) seconds on a running cluster,
    with PUBSUB_EMULATOR_HOST set; topic and subscription names are new, so a shared emulator
    is fine."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.url, headers=cluster.headers())
    to_submit: list[float] = []
    latencies: list[float] = []
    with running_service(cluster, project=PROJECT, state_dir=f"{tmp}/state",
                         run_dirs=f"{tmp}/runs/*") as running:
        for i in range(repeats):
            submitted, running_s = one_repeat(client, running.service, running.publisher,
                                              running.topic, Path(tmp, "runs"))
            to_submit.append(submitted)
            latencies.append(running_s)
            progress(f"repeat {i}: alert publish -> job RUNNING {running_s:.2f}s "
                     f"(publish -> submitted {submitted:.2f}s, submitted -> RUNNING "
                     f"{running_s - submitted:.2f}s)")
    return to_submit, latencies


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    with pubsub_emulator() as host, ray_cluster(tpu=TPU) as cluster, \
            tempfile.TemporaryDirectory() as tmp:
        os.environ["PUBSUB_EMULATOR_HOST"] = host
        try:
            to_submit, latencies = measure(cluster, args.repeats, Path(tmp),
                                           progress=lambda line: print(line, flush=True))
        except Exception as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"publish -> submitted: median {statistics.median(to_submit):.2f}s")
        print(f"median {statistics.median(latencies):.2f}s over {len(latencies)} "
              f"(min {min(latencies):.2f}s, max {max(latencies):.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
