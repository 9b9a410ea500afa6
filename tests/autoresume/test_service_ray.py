"""Autoresume against the real parts: Google's Pub/Sub emulator and a real Ray job server.

A run's first submission is killed (stopped); a real-format alert notification is published;
the service, pulling with the real google-cloud-pubsub client and acting through the real
JobSubmissionClient, resubmits it exactly once under <run>-r1 with the same entrypoint. A
duplicate notification, one for another run and a malformed one change nothing. Prints the
measured alert-publish -> job RUNNING latency.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid

import pytest

from orchestrator.autoresume.config import AutoresumeConfig, PolicyConfig, RayJobsConfig
from orchestrator.autoresume.intake import run_forever
from orchestrator.autoresume.ray_jobs import RUN_ID_METADATA, RayJobs
from orchestrator.autoresume.service import AutoresumeService
from tests.autoresume.notifications import encode, notification
from tests.autoresume.ray_server import ray_job_server
from tests.support.pubsub_emulator import emulator_fixture

pytestmark = [pytest.mark.cluster, pytest.mark.emulator]

pubsub_emulator_host = emulator_fixture(scope="module")


@pytest.fixture(scope="module")
def ray_url(monkeypatch_module):
    monkeypatch_module.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch_module.delenv("RAY_ADDRESS", raising=False)
    with ray_job_server() as url:
        yield url


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_alert_resubmits_dead_job_once(tmp_path, pubsub_emulator_host, ray_url):
    """Killed job + alert -> exactly one resubmission (<run>-r1), same entrypoint, running."""
    from google.cloud import pubsub_v1
    from ray.job_submission import JobStatus, JobSubmissionClient

    run_id = f"run-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, "-c", "import time; time.sleep(300)"]
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": run_id, "job": run_id, "entrypoint": argv,
        "runtime_env": {"env_vars": {"AUTORESUME_TEST": "1"}}, "incarnation": 0}))

    client = JobSubmissionClient(ray_url)
    first = client.submit_job(entrypoint=" ".join(argv[:2]) + " 'import time; time.sleep(300)'",
                              submission_id=f"{run_id}-r0", metadata={RUN_ID_METADATA: run_id})
    wait_for(lambda: client.get_job_status(first) == JobStatus.RUNNING, 60, "r0 running")
    client.stop_job(first)  # the job "dies"
    wait_for(lambda: client.get_job_status(first) == JobStatus.STOPPED, 60, "r0 stopped")

    project = "demo-project"
    topic = f"projects/{project}/topics/alerts-{uuid.uuid4().hex[:8]}"
    sub = f"projects/{project}/subscriptions/autoresume-{uuid.uuid4().hex[:8]}"
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=sub, topic=topic, ack_deadline_seconds=30)
    subscriber.close()

    cfg = AutoresumeConfig(subscription=sub, state_dir=str(tmp_path / "state"),
                           run_dirs=(str(tmp_path / "runs/*"),), tick_s=0.2,
                           ray=RayJobsConfig(address=ray_url, auth_mode="disabled"),
                           policy=PolicyConfig(startup_grace_s=0.0))
    service = AutoresumeService(cfg, ray=RayJobs(cfg.ray))
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(service, sub, stop), daemon=True)
    thread.start()
    second = f"{run_id}-r1"
    try:
        alert = encode(notification(incident_id=f"inc-{run_id}", run_id=run_id,
                                    started_at=int(time.time())))
        t0 = time.monotonic()
        publisher.publish(topic, alert).result(timeout=30)

        def r1_running() -> bool:
            try:
                return client.get_job_status(second) == JobStatus.RUNNING
            except RuntimeError:  # not submitted yet
                return False

        wait_for(r1_running, 120, "r1 running")
        latency = time.monotonic() - t0
        print(f"\nautoresume latency alert-publish -> job RUNNING: {latency:.2f}s")

        publisher.publish(topic, alert).result(timeout=30)  # duplicate
        publisher.publish(topic, encode(notification(incident_id="inc-other",
                                                     run_id="someone-else"))).result(timeout=30)
        publisher.publish(topic, b"{garbage").result(timeout=30)
        wait_for(lambda: len(service.audit.read()) >= 3 and service.dead_letters.read(), 60,
                 "all notifications handled")
    finally:
        stop.set()
        thread.join(timeout=30)
        publisher.stop()

    info = client.get_job_info(second)
    assert info.entrypoint == " ".join(__import__("shlex").quote(a) for a in argv)
    assert info.runtime_env["env_vars"] == {"AUTORESUME_TEST": "1"}
    assert info.metadata[RUN_ID_METADATA] == run_id
    ours = sorted(j.submission_id for j in client.list_jobs()
                  if j.submission_id and j.submission_id.startswith(run_id))
    assert ours == [f"{run_id}-r0", second]
    outcomes = [(a["run_id"], a["outcome"]) for a in service.audit.read()]
    assert outcomes == [(run_id, "submitted"), (run_id, "nothing"), ("someone-else", "nothing")]
    assert "duplicate" in service.audit.read()[1]["reason"]
    assert "not JSON" in service.dead_letters.read()[0]["reason"]
    assert not thread.is_alive()
    client.stop_job(second)
    wait_for(lambda: client.get_job_status(second).is_terminal(), 60, "r1 stopped")
