"""Pub/Sub streaming pull with flow control, supervised: reconnect with backoff, forever.

The client library already retries transient stream errors; when the pull future fails anyway
(server gone for long, subscription deleted, emulator restarted) the supervisor thread waits
with exponential backoff and subscribes again. Messages are handed to ``deliver`` together with
ack/nack callables: the intake acks only after recording.

Clients are made by a factory (a seam): the default builds real clients, on an insecure loopback
channel when an emulator address is configured (``emulator_host`` or PUBSUB_EMULATOR_HOST), with
application-default credentials otherwise.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from orchestrator.events.config import PubSubConfig

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Delivery:
    """One received message, transport-neutral."""

    data: bytes
    attributes: dict[str, str]
    message_id: str
    publish_time: float | None
    ack: Callable[[], None]
    nack: Callable[[], None]


def emulator_address(cfg: PubSubConfig) -> str | None:
    return cfg.emulator_host or os.environ.get("PUBSUB_EMULATOR_HOST") or None


def make_subscriber(cfg: PubSubConfig) -> Any:
    """Real SubscriberClient; loopback insecure channel for an emulator."""
    from google.cloud import pubsub_v1

    host = emulator_address(cfg)
    if host:
        import grpc
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        return pubsub_v1.SubscriberClient(
            transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(host)))
    return pubsub_v1.SubscriberClient()


def make_publisher(cfg: PubSubConfig, **kwargs: Any) -> Any:
    """Real PublisherClient; loopback insecure channel for an emulator."""
    from google.cloud import pubsub_v1

    host = emulator_address(cfg)
    if host:
        import grpc
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

        return pubsub_v1.PublisherClient(
            transport=PublisherGrpcTransport(channel=grpc.insecure_channel(host)), **kwargs)
    return pubsub_v1.PublisherClient(**kwargs)


def ensure_topic_and_subscription(publisher: Any, subscriber: Any, project: str, topic: str,
                                  subscription: str, *, ack_deadline_s: int = 60) -> None:
    """Create the topic and subscription if missing (emulator mode: its state is in memory)."""
    from google.api_core import exceptions

    topic_path = publisher.topic_path(project, topic)
    sub_path = subscriber.subscription_path(project, subscription)
    with contextlib.suppress(exceptions.AlreadyExists):
        publisher.create_topic(request={"name": topic_path}, timeout=10)
    with contextlib.suppress(exceptions.AlreadyExists):
        subscriber.create_subscription(
            request={"name": sub_path, "topic": topic_path,
                     "ack_deadline_seconds": ack_deadline_s}, timeout=10)


class PubSubSource:
    """Supervised streaming pull of one subscription."""

    def __init__(
        self, cfg: PubSubConfig, deliver: Callable[[Delivery], None], *,
        subscriber_factory: Callable[[PubSubConfig], Any] = make_subscriber,
        prepare: Callable[[], None] | None = None,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        if not cfg.subscription or not cfg.project:
            raise ValueError("PubSubSource needs events.pubsub.project and .subscription")
        self.cfg = cfg
        self._deliver = deliver
        self._factory = subscriber_factory
        self._prepare = prepare
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread: threading.Thread | None = None
        self._future: Any = None
        self._lock = threading.Lock()
        self.connects = 0
        self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="events-pubsub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            future = self._future
        if future is not None:
            try:
                future.cancel()
                future.result(timeout=10)
            except Exception:  # cancelled futures raise; shutdown must not
                pass
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _on_message(self, message: Any) -> None:
        stamp = getattr(message, "publish_time", None)
        publish_time = stamp.timestamp() if hasattr(stamp, "timestamp") else None
        self._deliver(Delivery(
            data=bytes(message.data), attributes=dict(message.attributes),
            message_id=str(message.message_id), publish_time=publish_time,
            ack=message.ack, nack=message.nack,
        ))

    def _run(self) -> None:
        from google.cloud import pubsub_v1

        delay = self.cfg.reconnect_initial_s
        while not self._stop.is_set():
            subscriber = None
            try:
                if self._prepare is not None:
                    self._prepare()
                subscriber = self._factory(self.cfg)
                path = subscriber.subscription_path(self.cfg.project, self.cfg.subscription)
                flow = pubsub_v1.types.FlowControl(max_messages=self.cfg.max_messages,
                                                   max_bytes=self.cfg.max_bytes)
                future = subscriber.subscribe(path, callback=self._on_message,
                                              flow_control=flow)
                with self._lock:
                    self._future = future
                self.connects += 1
                log.info("pubsub_subscribed", subscription=path, attempt=self.connects)
                if self._stop.is_set():
                    future.cancel()
                future.result()  # blocks until the stream fails or stop() cancels it
                if self._stop.is_set():
                    break
                delay = self.cfg.reconnect_initial_s
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.failures += 1
                log.warning("pubsub_stream_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                            retry_in_s=round(delay, 2),
                            fix="check that the subscription exists and Pub/Sub is reachable")
            finally:
                with self._lock:
                    self._future = None
                if subscriber is not None:
                    with contextlib.suppress(Exception):
                        subscriber.close()
            if self._sleep(delay):
                break
            delay = min(delay * 2, self.cfg.reconnect_max_s)
