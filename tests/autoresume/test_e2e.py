"""End to end: the real training job, killed, brought back by an alert.

`python -m orchestrator.main` is submitted to a real local Ray job server (`ray start --head`),
trains and checkpoints, and is killed (`stop_job`). A real-format Cloud Monitoring notification
is published to the Pub/Sub emulator; the autoresume service resubmits the run from run.json
(same entrypoint, same runtime env); the new submission restores the latest checkpoint and
reaches the target step. A duplicate notification and one for another run do nothing.

Slow (two driver start-ups on 2 cores): marked cluster+emulator; run with
`pytest tests/autoresume/test_e2e.py -s`. E2E_OVERRIDES is the tiny run the driver accepts.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from orchestrator.autoresume.config import AutoresumeConfig, PolicyConfig, RayJobsConfig
from orchestrator.autoresume.intake import run_forever
from orchestrator.autoresume.ray_jobs import RUN_ID_METADATA, RayJobs
from orchestrator.autoresume.service import AutoresumeService
from tests.autoresume.notifications import encode, notification
from tests.autoresume.ray_server import ray_job_server
from tests.support.pubsub_emulator import emulator_fixture

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.emulator,
    pytest.mark.skipif(importlib.util.find_spec("orchestrator.main") is None,
                       reason="orchestrator.main (the driver) does not exist yet"),
]

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 60
E2E_OVERRIDES = [
    "run.name=e2e",
    f"run.total_steps={TOTAL_STEPS}",
    "cluster.mode=emulate",
    "cluster.emulate.slices=1",
    "cluster.emulate.hosts_per_slice=2",
    "cluster.emulate.devices_per_host=2",
    "metrics.cloud_monitoring.enabled=false",
    "controller.checkpoint_interval.every_steps=10",
]
TIMEOUT_S = 420

pubsub_emulator_host = emulator_fixture(scope="module")


def wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = pred()
        except RuntimeError:  # job API hiccup (500) under load: ask again
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def checkpoint_steps(run_dir: Path) -> list[int]:
    ckpt = run_dir / "checkpoints"
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else []


def metric_steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_killed_training_job_resumes_from_checkpoint(tmp_path, pubsub_emulator_host,
                                                     monkeypatch):
    """kill -> alert -> resubmit -> restore -> target step; duplicates and strangers ignored."""
    from google.cloud import pubsub_v1
    from ray.job_submission import JobStatus, JobSubmissionClient

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run_dir = tmp_path / "runs" / "e2e"
    argv = ["python", "-m", "orchestrator.main", f"run.run_dir={run_dir}", *E2E_OVERRIDES]
    runtime_env = {"env_vars": {"PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
                                "RAY_AUTH_MODE": "disabled"}}
    with ray_job_server() as url:
        client = JobSubmissionClient(url)
        first = client.submit_job(entrypoint=" ".join(argv), submission_id="e2e-r0",
                                  runtime_env=runtime_env, metadata={RUN_ID_METADATA: "e2e"})
        try:
            wait_for(lambda: checkpoint_steps(run_dir) or
                     client.get_job_status(first).is_terminal(), TIMEOUT_S, "a checkpoint")
            assert checkpoint_steps(run_dir), client.get_job_logs(first)[-3000:]
            client.stop_job(first)  # the whole job dies
            wait_for(lambda: client.get_job_status(first).is_terminal(), 60, "r0 dead")
            saved = max(checkpoint_steps(run_dir))
            run_id = json.loads((run_dir / "run.json").read_text())["run_id"]

            topic = f"projects/demo/topics/alerts-{uuid.uuid4().hex[:8]}"
            sub = f"projects/demo/subscriptions/autoresume-{uuid.uuid4().hex[:8]}"
            publisher = pubsub_v1.PublisherClient()
            subscriber = pubsub_v1.SubscriberClient()
            publisher.create_topic(name=topic)
            subscriber.create_subscription(name=sub, topic=topic)
            subscriber.close()
            cfg = AutoresumeConfig(subscription=sub, state_dir=str(tmp_path / "state"),
                                   run_dirs=(str(tmp_path / "runs/*"),), tick_s=0.2,
                                   ray=RayJobsConfig(address=url, auth_mode="disabled"),
                                   policy=PolicyConfig(startup_grace_s=0.0))
            service = AutoresumeService(cfg, ray=RayJobs(cfg.ray))
            stop = threading.Event()
            thread = threading.Thread(target=run_forever, args=(service, sub, stop), daemon=True)
            thread.start()
            try:
                alert = encode(notification(incident_id="e2e-inc", run_id="e2e",
                                            started_at=int(time.time())))
                t0 = time.monotonic()
                publisher.publish(topic, alert).result(timeout=30)
                second = f"{run_id}-r1"

                def running() -> bool:
                    try:
                        return client.get_job_status(second) == JobStatus.RUNNING
                    except RuntimeError:
                        return False

                wait_for(running, 120, "resubmitted job running")
                print(f"\ne2e latency alert-publish -> job RUNNING: {time.monotonic() - t0:.2f}s")
                publisher.publish(topic, alert).result(timeout=30)
                publisher.publish(topic, encode(notification(
                    incident_id="x", run_id="not-this-run"))).result(timeout=30)
                wait_for(lambda: client.get_job_status(second).is_terminal(), TIMEOUT_S,
                         "resubmitted job finished")
                wait_for(lambda: len(service.audit.read()) >= 3, 60, "all notifications")
            finally:
                stop.set()
                thread.join(timeout=30)
                publisher.stop()
            assert client.get_job_status(second) == JobStatus.SUCCEEDED, (
                client.get_job_logs(second)[-3000:])
            records = metric_steps(run_dir)
            assert max(r["step"] for r in records) == TOTAL_STEPS
            resumed = [r["step"] for r in records if r.get("incarnation", 0) >= 2]
            assert resumed and min(resumed) > saved, "second incarnation did not resume"
            subs = sorted(j.submission_id for j in client.list_jobs())
            assert subs == ["e2e-r0", second]
            assert [a["outcome"] for a in service.audit.read()] == [
                "submitted", "nothing", "nothing"]
        finally:
            try:
                for job in client.list_jobs():
                    if not job.status.is_terminal():
                        client.stop_job(job.submission_id)
            except RuntimeError:
                pass  # the Ray head is killed with its process group right after this
