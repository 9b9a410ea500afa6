"""The autoresume service as the real-parts tests and the latency bench run it: a fresh alert
topic and subscription on the emulator (PUBSUB_EMULATOR_HOST must be set), the service pulling
it in a thread, acting on the cluster's job API with its token."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from orchestrator.autoresume.config import (
    AutoresumeConfig,
    OriginConfig,
    PolicyConfig,
    RayJobsConfig,
)
from orchestrator.autoresume.intake import run_forever
from orchestrator.autoresume.ray_jobs import RayJobs
from orchestrator.autoresume.service import AutoresumeService
from tests.autoresume.ray_server import RayCluster


@dataclass
class RunningService:
    service: AutoresumeService
    publisher: Any
    topic: str
    thread: threading.Thread


@contextmanager
def running_service(cluster: RayCluster, *, project: str, state_dir: str, run_dirs: str,
                    ack_deadline_s: int | None = None) -> Iterator[RunningService]:
    """Yields the running service; stops its thread and the publisher on the way out."""
    from google.cloud import pubsub_v1

    name = uuid.uuid4().hex[:8]
    topic = f"projects/{project}/topics/alerts-{name}"
    sub = f"projects/{project}/subscriptions/autoresume-{name}"
    publisher = pubsub_v1.PublisherClient()
    publisher.create_topic(name=topic)
    with pubsub_v1.SubscriberClient() as subscriber:
        extra = {} if ack_deadline_s is None else {"ack_deadline_seconds": ack_deadline_s}
        subscriber.create_subscription(name=sub, topic=topic, **extra)
    cfg = AutoresumeConfig(subscription=sub, state_dir=state_dir, run_dirs=(run_dirs,),
                           tick_s=0.2,
                           ray=RayJobsConfig(address=cluster.url, auth_mode="token",
                                             token_file=cluster.token_path),
                           policy=PolicyConfig(startup_grace_s=0.0),
                           origin=OriginConfig(project=project))
    service = AutoresumeService(cfg, ray=RayJobs(cfg.ray))
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(service, sub, stop), daemon=True)
    thread.start()
    try:
        yield RunningService(service=service, publisher=publisher, topic=topic, thread=thread)
    finally:
        stop.set()
        thread.join(timeout=30)
        publisher.stop()
