"""Streaming pull of the alerts subscription into the service (google-cloud-pubsub).

``PUBSUB_EMULATOR_HOST`` is honoured by the client itself. Every message first goes through the
event intake's bounded parser (``orchestrator.events.bounded``: size and nesting-depth limits):
a poison message (huge, deeply nested, not JSON) is dead-lettered with its reason and acked, never
redelivered forever. A message is acked only after the service has recorded it; an unexpected
error nacks it (Pub/Sub redelivers, and the subscription's dead-letter policy caps the attempts).
A subscription that fails (deleted, permission denied, network) is re-opened with backoff and
logged, never a crash loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from orchestrator.autoresume.service import AutoresumeService
from orchestrator.events import bounded
from orchestrator.events.model import MalformedEvent

log = structlog.get_logger(__name__)

MAX_REOPEN_S = 300.0
MAX_MESSAGE_BYTES = bounded.PUBSUB_MAX_BYTES  # an alert notification is a few KiB
MAX_DEPTH = bounded.DEFAULT_MAX_DEPTH


def handle_delivery(service: AutoresumeService, data: bytes, *, message_id: str = "") -> str:
    """The shared guards, then the service: what was done ("dead_letter" for poison).
    Raises only what the service raises on a well-formed message (the caller nacks that)."""
    try:
        bounded.loads(data, max_bytes=MAX_MESSAGE_BYTES, max_depth=MAX_DEPTH)
    except MalformedEvent as exc:
        return service._dead_letter(bytes(data[:65536]), exc.reason, message_id,
                                    service.clock())
    return service.handle_message(data, message_id=message_id)


def _default_subscriber() -> Any:
    from google.cloud import pubsub_v1

    return pubsub_v1.SubscriberClient()


def run_forever(
    service: AutoresumeService,
    subscription: str,
    stop: threading.Event,
    *,
    subscriber_factory: Callable[[], Any] = _default_subscriber,
    max_messages: int = 8,
) -> None:
    """Pull, handle, ack until ``stop`` is set; run scheduled retries every ``tick_s``."""
    from google.cloud import pubsub_v1

    def callback(message: Any) -> None:
        try:
            handle_delivery(service, message.data, message_id=message.message_id)
        except Exception:
            log.exception("autoresume_handle_failed", message_id=message.message_id)
            message.nack()
            return
        message.ack()

    reopen_s = 1.0
    while not stop.is_set():
        subscriber = subscriber_factory()
        future = subscriber.subscribe(
            subscription, callback=callback,
            flow_control=pubsub_v1.types.FlowControl(max_messages=max_messages),
        )
        log.info("autoresume_listening", subscription=subscription)
        try:
            while not stop.is_set() and not future.done():
                service.process_due()
                stop.wait(service.cfg.tick_s)
        finally:
            future.cancel()
            try:
                future.result(timeout=10)
            except Exception as exc:
                if not stop.is_set():
                    log.error("autoresume_subscription_failed", subscription=subscription,
                              error=f"{type(exc).__name__}: {exc}", retry_in_s=reopen_s,
                              fix="check the subscription exists and the service account has "
                                  "roles/pubsub.subscriber on it")
            subscriber.close()
        if not stop.is_set():
            stop.wait(reopen_s)
            reopen_s = min(MAX_REOPEN_S, reopen_s * 2)
