"""Dead letters also published to ``events.pubsub.dead_letter_topic`` (original bytes, reason in
the attributes), so a subscription-level consumer can see what the run refused. Best effort: the
dead letter is always in RUN_DIR/dead_letters.jsonl first."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import structlog

from orchestrator.events.config import PubSubConfig
from orchestrator.events.eventlog import raw_for_record

log = structlog.get_logger(__name__)

MAX_MESSAGE_BYTES = 10 * 1024 * 1024 - 1024  # Pub/Sub's limit, minus room for attributes


class DeadLetterPublisher:
    """One publisher client, created on first use, stopped by ``stop``."""

    def __init__(self, cfg: PubSubConfig, job: str,
                 factory: Callable[[PubSubConfig], Any]) -> None:
        self.cfg = cfg
        self.job = job
        self._factory = factory
        self._client: Any = None

    def publish(self, payload: Any, reason: str, message_id: str | None) -> None:
        """Publish and wait (bounded); failures are logged, never raised."""
        try:
            if isinstance(payload, (bytes, bytearray, memoryview)):
                data = bytes(payload)
            elif isinstance(payload, str):
                data = payload.encode("utf-8", "replace")
            else:
                data = json.dumps(raw_for_record(payload), default=repr).encode("utf-8")
            if self._client is None:
                self._client = self._factory(self.cfg)
            topic = self._client.topic_path(self.cfg.project, self.cfg.dead_letter_topic)
            future = self._client.publish(
                topic, data[:MAX_MESSAGE_BYTES], dead_letter_reason=reason[:1000], job=self.job,
                original_message_id=message_id or "")
            future.result(timeout=10)
        except Exception as exc:
            log.warning("dead_letter_publish_failed", error=str(exc)[:300],
                        fix="check events.pubsub.dead_letter_topic exists; the dead letter is "
                            "still in dead_letters.jsonl")

    def stop(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client = None
