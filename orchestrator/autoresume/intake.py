"""Streaming pull of the alerts subscription into the service (google-cloud-pubsub).

``PUBSUB_EMULATOR_HOST`` is honoured by the client itself. A message is acked only after the
service has recorded it; an unexpected error nacks it (Pub/Sub redelivers, and the subscription's
dead-letter policy caps the attempts). A subscription that fails (deleted, permission denied,
network) is re-opened with backoff and logged, never a crash loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from orchestrator.autoresume.service import AutoresumeService

log = structlog.get_logger(__name__)

MAX_REOPEN_S = 300.0


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
            service.handle_message(message.data, message_id=message.message_id)
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
