"""Measure alert-publish -> resubmitted job RUNNING, locally (Pub/Sub emulator + `ray start`).

    .venv/bin/python bench/autoresume_latency.py --repeats 3

Each repeat: a run whose first submission was stopped; publish a real-format notification;
time until Ray reports the resubmission RUNNING. Starts and always stops its own emulator and
Ray head (no `ray stop`). Prints one line per repeat and the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")

from orchestrator.autoresume.config import AutoresumeConfig, PolicyConfig, RayJobsConfig
from orchestrator.autoresume.intake import run_forever
from orchestrator.autoresume.ray_jobs import RUN_ID_METADATA, RayJobs
from orchestrator.autoresume.service import AutoresumeService
from tests.autoresume.notifications import encode, notification
from tests.autoresume.ray_server import ray_job_server
from tests.support.pubsub_emulator import pubsub_emulator


def wait_for(pred, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.pop("RAY_ADDRESS", None)
    from google.cloud import pubsub_v1
    from ray.job_submission import JobStatus, JobSubmissionClient

    with pubsub_emulator() as host, ray_job_server() as url, \
            tempfile.TemporaryDirectory() as tmp:
        os.environ["PUBSUB_EMULATOR_HOST"] = host
        client = JobSubmissionClient(url)
        topic, sub = "projects/bench/topics/alerts", "projects/bench/subscriptions/autoresume"
        publisher = pubsub_v1.PublisherClient()
        publisher.create_topic(name=topic)
        with pubsub_v1.SubscriberClient() as s:
            s.create_subscription(name=sub, topic=topic)
        cfg = AutoresumeConfig(subscription=sub, state_dir=f"{tmp}/state",
                               run_dirs=(f"{tmp}/runs/*",), tick_s=0.2,
                               ray=RayJobsConfig(address=url, auth_mode="disabled"),
                               policy=PolicyConfig(startup_grace_s=0.0))
        service = AutoresumeService(cfg, ray=RayJobs(cfg.ray))
        stop = threading.Event()
        thread = threading.Thread(target=run_forever, args=(service, sub, stop), daemon=True)
        thread.start()
        argv = [sys.executable, "-c", "import time; time.sleep(120)"]
        latencies: list[float] = []
        to_submit: list[float] = []
        try:
            for i in range(args.repeats):
                run_id = f"bench-{uuid.uuid4().hex[:6]}"
                run_dir = Path(tmp, "runs", run_id)
                run_dir.mkdir(parents=True)
                (run_dir / "run.json").write_text(json.dumps(
                    {"run_id": run_id, "job": run_id, "entrypoint": argv, "runtime_env": {}}))
                first = client.submit_job(entrypoint="sleep 120", submission_id=f"{run_id}-r0",
                                          metadata={RUN_ID_METADATA: run_id})
                wait_for(lambda f=first: client.get_job_status(f) == JobStatus.RUNNING, 60)
                client.stop_job(first)
                wait_for(lambda f=first: client.get_job_status(f).is_terminal(), 60)
                t0, t0_wall = time.monotonic(), time.time()
                publisher.publish(topic, encode(notification(
                    incident_id=f"inc-{run_id}", run_id=run_id,
                    started_at=int(time.time())))).result(timeout=30)

                def running(r=run_id) -> bool:
                    try:
                        return client.get_job_status(f"{r}-r1") == JobStatus.RUNNING
                    except RuntimeError:
                        return False

                wait_for(running, 120)
                latencies.append(time.monotonic() - t0)
                submitted = [a["at"] for a in service.audit.read()
                             if a.get("run_id") == run_id and a.get("outcome") == "submitted"]
                to_submit.append(submitted[0] - t0_wall)
                print(f"repeat {i}: alert publish -> job RUNNING {latencies[-1]:.2f}s "
                      f"(publish -> submitted {to_submit[-1]:.2f}s, submitted -> RUNNING "
                      f"{latencies[-1] - to_submit[-1]:.2f}s)", flush=True)
                client.stop_job(f"{run_id}-r1")
        finally:
            stop.set()
            thread.join(timeout=30)
            publisher.stop()
        print(f"publish -> submitted: median {statistics.median(to_submit):.2f}s")
        print(f"median {statistics.median(latencies):.2f}s over {len(latencies)} "
              f"(min {min(latencies):.2f}s, max {max(latencies):.2f}s)")


if __name__ == "__main__":
    main()
