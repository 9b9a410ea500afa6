"""Autoresume against the real parts: Google's Pub/Sub emulator and a real Ray job server.

The cluster runs with Ray token auth ON; the service sends the token from `ray.token_file`. A
run's first submission dies (FAILED: the driver exits 2 on a missing config, in a second, so no
training is needed); a real-format alert notification is published; the service, pulling with the
real google-cloud-pubsub client and acting through the real JobSubmissionClient, resubmits it
exactly once under <run>-r1 with the same entrypoint and the run.json env minus the redacted
secret. A duplicate notification, one for another run and a malformed one change nothing. Prints
the measured alert-publish -> submitted latency.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid

import pytest

from orchestrator.autoresume.ray_jobs import RUN_ID_METADATA
from orchestrator.autoresume.runenv import REDACTED
from tests.autoresume.notifications import encode, notification
from tests.autoresume.service_harness import running_service

pytestmark = [pytest.mark.cluster, pytest.mark.emulator]

def wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_alert_resubmits_dead_job_once(tmp_path, pubsub_emulator_host, tpu_cluster):
    """Killed job + alert -> exactly one resubmission (<run>-r1), same entrypoint, running."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    cluster = tpu_cluster
    run_id = f"run-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    argv = ["python", "-m", "orchestrator.main", "--config", "missing.yaml",
            f"run.run_dir={run_dir}"]
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": run_id, "job": run_id, "entrypoint": argv, "incarnation": 0,
        "runtime_env": {"env_vars": {"TPU_STDERR_LOG_LEVEL": "0", "HF_TOKEN": REDACTED}}}))

    with pytest.raises(Exception, match=r"(?i)auth"):  # auth is on: no token, no job API
        JobSubmissionClient(cluster.url, headers={"Authorization": "Bearer wrong"}).list_jobs()
    client = JobSubmissionClient(cluster.url, headers=cluster.headers())
    first = client.submit_job(entrypoint=shlex.join(argv), submission_id=f"{run_id}-r0",
                              metadata={RUN_ID_METADATA: run_id})
    wait_for(lambda: client.get_job_status(first) == JobStatus.FAILED, 60, "r0 failed")

    second = f"{run_id}-r1"
    with running_service(cluster, project="demo-project", state_dir=str(tmp_path / "state"),
                         run_dirs=str(tmp_path / "runs/*"), ack_deadline_s=30) as running:
        service, publisher, topic = running.service, running.publisher, running.topic
        alert = encode(notification(incident_id=f"inc-{run_id}", run_id=run_id,
                                    started_at=int(time.time())))
        t0 = time.monotonic()
        publisher.publish(topic, alert).result(timeout=30)

        def r1_submitted() -> bool:
            try:
                return client.get_job_status(second) is not None
            except RuntimeError:  # not submitted yet
                return False

        wait_for(r1_submitted, 120, "r1 submitted")
        latency = time.monotonic() - t0
        print(f"\nautoresume latency alert-publish -> job submitted: {latency:.2f}s")

        publisher.publish(topic, alert).result(timeout=30)  # duplicate
        publisher.publish(topic, encode(notification(incident_id="inc-other",
                                                     run_id="someone-else"))).result(timeout=30)
        publisher.publish(topic, b"{garbage").result(timeout=30)
        wait_for(lambda: len(service.audit.read()) >= 3 and service.dead_letters.read(), 60,
                 "all notifications handled")
    thread = running.thread

    info = client.get_job_info(second)
    assert info.entrypoint == shlex.join(argv)
    assert info.runtime_env["env_vars"] == {"TPU_STDERR_LOG_LEVEL": "0"}
    assert info.metadata[RUN_ID_METADATA] == run_id
    ours = sorted(j.submission_id for j in client.list_jobs()
                  if j.submission_id and j.submission_id.startswith(run_id))
    assert ours == [f"{run_id}-r0", second]
    outcomes = [(a["run_id"], a["outcome"]) for a in service.audit.read()]
    assert outcomes == [(run_id, "submitted"), (run_id, "nothing"), ("someone-else", "nothing")]
    assert "duplicate" in service.audit.read()[1]["reason"]
    assert "not JSON" in service.dead_letters.read()[0]["reason"]
    assert not thread.is_alive()
    wait_for(lambda: client.get_job_status(second).is_terminal(), 60, "r1 ended")
