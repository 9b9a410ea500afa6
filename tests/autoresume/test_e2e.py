"""End to end: the real training job, killed, brought back by an alert.

A local Ray cluster like a TPU cluster: `ray start --head` with the job server, and two worker
nodes joined to it that carry TPU resources and slice labels (one emulated slice of 2 hosts x 1
CPU device). `python -m orchestrator.main` is submitted through the real job API with
cluster.mode=auto, so the driver uses the job's RAY_ADDRESS and finds those hosts. Ray token auth
is on throughout. It trains, checkpoints every 5 steps, and its driver is killed (SIGKILL: the job
FAILS; a `ray job stop` would mean "do not resume"). A real-format Cloud Monitoring notification
is published to the Pub/Sub emulator; the autoresume service resubmits the run from run.json
(same entrypoint; same runtime env minus the secret the driver redacted); the second driver
restores the newest complete tier (the RAM copies its detached holders kept) and reaches the
target step. A duplicate notification and one for another run do nothing.

Slow (two driver start-ups on 2 cores): marked cluster+emulator; run with
`pytest tests/autoresume/test_e2e.py -s` to see the measured latency.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import time
from pathlib import Path

import pytest

from orchestrator.autoresume.ray_jobs import RUN_ID_METADATA
from orchestrator.autoresume.runenv import REDACTED
from orchestrator.autoresume.service import AutoresumeService
from tests.autoresume.conftest import TPU
from tests.autoresume.notifications import encode, notification
from tests.autoresume.service_harness import running_service
from workers.ram import copy_store

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.emulator,
    pytest.mark.skipif(importlib.util.find_spec("orchestrator.main") is None,
                       reason="orchestrator.main (the driver) does not exist yet"),
]

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 20
CHECKPOINT_EVERY = 5
E2E_OVERRIDES = [
    "run.name=e2e",
    f"run.total_steps={TOTAL_STEPS}",
    "cluster.mode=auto",  # RAY_ADDRESS (set by the job) -> the TPU-labelled nodes of this cluster
    f"cluster.emulate.slices={TPU.slices}",
    f"cluster.emulate.hosts_per_slice={TPU.hosts_per_slice}",
    f"cluster.emulate.devices_per_host={TPU.devices_per_host}",
    "metrics.cloud_monitoring.enabled=false",
    f"controller.checkpoint_interval.every_steps={CHECKPOINT_EVERY}",
    # The RAM tier: a copy of every step on the other host, in detached holders that outlive
    # the killed driver; durable saves are written from those copies (checkpoints-from-ram).
    "checkpoint.ram.enabled=true",
    "checkpoint.ram.every=1",  # every step, whatever the copy costs here (auto may choose fewer)
]
TIMEOUT_S = 300
RESTORED = re.compile(r"restored step (\d+) from (\w+) tier")

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
    """Durable steps: Orbax's, and those the holders saved from the RAM copies."""
    ckpt = run_dir / "checkpoints"
    orbax = [int(p.name) for p in ckpt.iterdir() if p.name.isdigit()] if ckpt.is_dir() else []
    return sorted({*orbax, *copy_store.complete_steps(copy_store.copies_dir(ckpt))})


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def drivers(timeline: list[dict]) -> list[list[dict]]:
    """The timeline split per driver process: each one starts with a PLANNING line (prev None)."""
    out: list[list[dict]] = []
    for t in timeline:
        if t["prev"] is None:
            out.append([])
        out[-1].append(t)
    return out


def restored_steps(transitions: list[dict]) -> list[tuple[int, str]]:
    """(step, tier) this driver restored (RESTORING -> COMPILING "restored step N from T
    tier")."""
    return [(int(m.group(1)), m.group(2)) for t in transitions
            if t["prev"] == "RESTORING" and (m := RESTORED.search(t["reason"]))]


def decisions(service: AutoresumeService) -> list[dict]:
    """Audit entries that are decisions (not retries after a job API hiccup under load)."""
    return [a for a in service.audit.read() if a.get("action") != "RETRY"]


def test_killed_training_job_resumes_from_checkpoint(tmp_path, pubsub_emulator_host,
                                                     tpu_cluster):
    """kill -> alert -> resubmit -> restore -> target step; duplicates and strangers ignored."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    run_dir = tmp_path / "runs" / "e2e"
    argv = ["python", "-m", "orchestrator.main", f"run.run_dir={run_dir}", *E2E_OVERRIDES]
    runtime_env = {"env_vars": {"JAX_PLATFORMS": "cpu", "E2E_API_TOKEN": "s3cret"}}
    cluster = tpu_cluster
    client = JobSubmissionClient(cluster.url, headers=cluster.headers())
    first = client.submit_job(entrypoint=" ".join(argv), submission_id="e2e-r0",
                              runtime_env=runtime_env, metadata={RUN_ID_METADATA: "e2e"})
    try:
        wait_for(lambda: checkpoint_steps(run_dir) or
                 client.get_job_status(first).is_terminal(), TIMEOUT_S, "a checkpoint")
        assert checkpoint_steps(run_dir), client.get_job_logs(first)[-3000:]
        os.kill(int(client.get_job_info(first).driver_info.pid), signal.SIGKILL)
        wait_for(lambda: client.get_job_status(first).is_terminal(), 60, "r0 dead")
        assert client.get_job_status(first) == JobStatus.FAILED
        saved = max(checkpoint_steps(run_dir))
        reached = max(r["step"] for r in read_jsonl(run_dir / "metrics.jsonl"))
        meta = json.loads((run_dir / "run.json").read_text())
        run_id = meta["run_id"]
        assert run_id == "e2e"  # the run name is the run id
        assert meta["runtime_env"]["env_vars"]["E2E_API_TOKEN"] == REDACTED

        second = f"{run_id}-r1"
        with running_service(cluster, project="demo-project",
                             state_dir=str(tmp_path / "state"),
                             run_dirs=str(tmp_path / "runs/*")) as svc:
            service, publisher, topic = svc.service, svc.publisher, svc.topic
            alert = encode(notification(incident_id="e2e-inc", run_id="e2e",
                                        started_at=int(time.time())))
            published_wall = time.time()
            t0 = time.monotonic()
            publisher.publish(topic, alert).result(timeout=30)

            def running() -> bool:
                try:
                    return client.get_job_status(second) == JobStatus.RUNNING
                except RuntimeError:  # not submitted yet
                    return False

            wait_for(running, 120, "resubmitted job running")
            latency = time.monotonic() - t0
            print(f"\ne2e latency alert-publish -> job RUNNING: {latency:.2f}s")
            publisher.publish(topic, alert).result(timeout=30)  # at-least-once: again
            publisher.publish(topic, encode(notification(
                incident_id="other-inc", run_id="not-this-run"))).result(timeout=30)
            wait_for(lambda: client.get_job_status(second).is_terminal(), TIMEOUT_S,
                     "resubmitted job finished")
            wait_for(lambda: len(decisions(service)) >= 3, 60, "all notifications")
        assert client.get_job_status(second) == JobStatus.SUCCEEDED, (
            client.get_job_logs(second)[-3000:])

        # Ray: exactly one resubmission, with the original entrypoint and runtime env.
        jobs = {j.submission_id: j for j in client.list_jobs()
                if (j.submission_id or "").startswith("e2e-")}
        assert set(jobs) == {"e2e-r0", second}
        assert jobs[second].entrypoint == shlex.join(argv)
        assert jobs[second].runtime_env["env_vars"] == {"JAX_PLATFORMS": "cpu"}

        # The audit: one submission for the incident; the duplicate and the stranger ignored.
        audit = decisions(service)
        assert len(audit) == 3, audit
        by_incident: dict[str, list[str]] = {}
        for a in audit:
            by_incident.setdefault(a["incident_id"], []).append(a["outcome"])
        assert by_incident == {"e2e-inc": ["submitted", "nothing"],
                               "other-inc": ["nothing"]}

        # The second driver restored a checkpoint (step > 0) and reached the target.
        runs = drivers(read_jsonl(run_dir / "timeline.jsonl"))
        assert len(runs) == 2
        assert restored_steps(runs[0]) == []
        ((restored, tier),) = restored_steps(runs[1])
        # the newest complete tier: the holders' RAM copies outlived the driver, so nothing
        # committed is lost and at most the step in flight is
        assert tier == "ram" and restored >= max(saved, reached - 1) and saved > 0, (
            restored, tier, saved, reached)
        assert runs[1][-1]["state"] == "SUCCEEDED"
        assert runs[1][-1]["step"] == TOTAL_STEPS
        after = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")
                 if r["wall_time"] > published_wall]
        assert min(after) == restored + 1, "the second driver did not resume where it saved"
        assert max(after) == TOTAL_STEPS
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["state"] == "SUCCEEDED"
        meta = json.loads((run_dir / "run.json").read_text())
        assert (meta["run_id"], meta["incarnation"]) == (run_id, 2)
        print(f"e2e: killed with metrics.jsonl at step {reached}, latest checkpoint {saved}; "
              f"second restored {restored} from the {tier} tier and finished {TOTAL_STEPS}")
    finally:
        try:
            for job in client.list_jobs():
                if (job.submission_id or "").startswith("e2e-") and not job.status.is_terminal():
                    client.stop_job(job.submission_id)
        except RuntimeError:
            pass  # a job API hiccup: the package fixture stops the whole cluster later
