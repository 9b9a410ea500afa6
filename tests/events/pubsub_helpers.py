"""Topic/subscription plumbing for emulator tests (fresh names per test)."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.events.config import PubSubConfig
from orchestrator.events.pubsub_source import make_publisher, make_subscriber
from tests.support.pubsub_emulator import unique_name

PROJECT = "test-project"


class PubSubFixture:
    """Creates a fresh topic + subscription on an emulator and publishes into it."""

    def __init__(self, host: str, *, ack_deadline_s: int = 10) -> None:
        self.host = host
        self.admin_cfg = PubSubConfig(project=PROJECT, emulator_host=host)
        self.publisher = make_publisher(self.admin_cfg)
        self.subscriber = make_subscriber(self.admin_cfg)
        self.topic = unique_name("events")
        self.subscription = unique_name("intake")
        self.create(ack_deadline_s)

    def create(self, ack_deadline_s: int = 10) -> None:
        self.publisher.create_topic(request={"name": self.topic_path(self.topic)}, timeout=10)
        self.subscriber.create_subscription(request={
            "name": self.sub_path(self.subscription), "topic": self.topic_path(self.topic),
            "ack_deadline_seconds": ack_deadline_s}, timeout=10)

    def topic_path(self, topic: str) -> str:
        return self.publisher.topic_path(PROJECT, topic)

    def sub_path(self, sub: str) -> str:
        return self.subscriber.subscription_path(PROJECT, sub)

    def config(self, **kw: Any) -> PubSubConfig:
        opts: dict[str, Any] = {"project": PROJECT, "subscription": self.subscription,
                                "topic": self.topic, "emulator_host": self.host,
                                "reconnect_initial_s": 0.2, "reconnect_max_s": 1.0}
        opts.update(kw)
        return PubSubConfig(**opts)

    def publish(self, data: bytes | dict, topic: str | None = None, **attrs: str) -> str:
        if isinstance(data, dict):
            data = json.dumps(data).encode()
        future = self.publisher.publish(self.topic_path(topic or self.topic), data, **attrs)
        return future.result(timeout=30)

    def pull(self, sub: str, max_messages: int = 10) -> list[Any]:
        resp = self.subscriber.pull(request={"subscription": self.sub_path(sub),
                                             "max_messages": max_messages}, timeout=10)
        return list(resp.received_messages)

    def close(self) -> None:
        self.subscriber.close()
        self.publisher.stop()  # flush batches before the channel goes
        self.publisher.transport.close()
