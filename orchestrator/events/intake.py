"""The event intake: every source in, clean events out, everything recorded.

Threads: the Pub/Sub supervisor and the inbox watcher parse in their own threads; malformed
payloads become dead letters and irrelevant ones are recorded and acknowledged right there.
Relevant events wait in a queue until the driver calls ``poll(hosts, incarnation)``, which drops
duplicates and stale events (with the reason), records each one in events.jsonl, and only then
acknowledges the messages they came from. Nothing raises into the driver: a failure in a source
is logged and the source retries.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from orchestrator.events import parsing
from orchestrator.events.config import EventsConfig, PubSubConfig
from orchestrator.events.dedupe import DedupeWindow
from orchestrator.events.eventlog import JsonlWriter, raw_for_record, recent_event_ids
from orchestrator.events.inbox import InboxWatcher
from orchestrator.events.model import Event, MalformedEvent
from orchestrator.events.pubsub_source import (
    Delivery,
    PubSubSource,
    ensure_topic_and_subscription,
    make_publisher,
    make_subscriber,
)
from orchestrator.events.relevance import Verdict, relevance, staleness
from orchestrator.hosts import HostRef

log = structlog.get_logger(__name__)

EVENTS_FILE = "events.jsonl"
DEAD_LETTERS_FILE = "dead_letters.jsonl"
DEDUPE_FILE = "event_dedupe.json"
PUBSUB_INFO_FILE = "pubsub.json"  # where a driver-started emulator is, for the CLI
LOCAL_PROJECT = "local-project"
DEDUPE_SAVE_INTERVAL_S = 1.0


@dataclass
class _Pending:
    event: Event
    via: str
    received_at: float
    ack: Callable[[], None] | None
    attributes: Mapping[str, str] = field(default_factory=dict)


def _noop() -> None:
    return None


class EventIntake:
    """Owns the sources, the dedupe window and the run directory's event records."""

    def __init__(
        self, cfg: EventsConfig, *, run_dir: Path, job: str,
        clock: Callable[[], float] = time.time,
        subscriber_factory: Callable[[PubSubConfig], Any] = make_subscriber,
        publisher_factory: Callable[[PubSubConfig], Any] = make_publisher,
        emulator_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.job = job
        self._clock = clock
        self._subscriber_factory = subscriber_factory
        self._publisher_factory = publisher_factory
        self._emulator_factory = emulator_factory
        self._pubsub_cfg = cfg.pubsub
        self._pending: list[_Pending] = []
        self._cond = threading.Condition()
        self._dedupe = DedupeWindow(cfg.dedupe_window, self.run_dir / DEDUPE_FILE)
        self._events: JsonlWriter | None = None
        self._dead: JsonlWriter | None = None
        self._inbox: InboxWatcher | None = None
        self._pubsub: PubSubSource | None = None
        self._emulator: Any = None
        self._dl_publisher: Any = None
        self._last_save = 0.0
        self._started = False
        self.counts: Counter[str] = Counter()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Open the records, reload the dedupe window, start the background sources."""
        if self._started:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._events = JsonlWriter(self.run_dir / EVENTS_FILE)
        self._dead = JsonlWriter(self.run_dir / DEAD_LETTERS_FILE)
        self._dedupe.load(recent_event_ids(self.run_dir / EVENTS_FILE))
        self._started = True
        if self.cfg.inbox:
            self._inbox = InboxWatcher(self.run_dir, self._on_inbox_file,
                                       poll_s=self.cfg.inbox_poll_s,
                                       max_bytes=self.cfg.pubsub.max_payload_bytes)
            self._inbox.start()
        self._start_pubsub()
        log.info("event_intake_started", run_dir=str(self.run_dir), job=self.job,
                 inbox=self.cfg.inbox, pubsub=self._pubsub is not None,
                 remembered_ids=len(self._dedupe))

    def _start_pubsub(self) -> None:
        cfg: PubSubConfig | None = self.cfg.pubsub
        prepare = None
        if cfg is not None and cfg.emulator:
            if not (cfg.emulator_host or _env_emulator()):
                cfg = self._start_emulator(cfg)
                if cfg is None:
                    return
            cfg = replace(cfg, project=cfg.project or LOCAL_PROJECT,
                          topic=cfg.topic or f"{self.job}-events",
                          subscription=cfg.subscription or f"{self.job}-intake")
            info = {"emulator_host": cfg.emulator_host or _env_emulator(), "project": cfg.project,
                    "topic": cfg.topic, "subscription": cfg.subscription}
            (self.run_dir / PUBSUB_INFO_FILE).write_text(json.dumps(info), encoding="utf-8")
            emulated = cfg

            def prepare() -> None:  # the emulator forgets everything when restarted
                publisher = self._publisher_factory(emulated)
                subscriber = self._subscriber_factory(emulated)
                try:
                    ensure_topic_and_subscription(publisher, subscriber, emulated.project or "",
                                                  emulated.topic or "",
                                                  emulated.subscription or "")
                finally:
                    subscriber.close()
                    publisher.transport.close()
        if cfg is None or not cfg.enabled:
            return
        self._pubsub_cfg = cfg
        self._pubsub = PubSubSource(cfg, self._on_delivery,
                                    subscriber_factory=self._subscriber_factory, prepare=prepare)
        self._pubsub.start()

    def _start_emulator(self, cfg: PubSubConfig) -> PubSubConfig | None:
        """Embedded default: run Google's emulator for this driver when gcloud exists."""
        from orchestrator.events.emulator import EmulatorProcess, gcloud_available

        if self._emulator_factory is None and not gcloud_available():
            log.warning("pubsub_emulator_unavailable",
                        fix="install the Google Cloud CLI, or publish with the inbox "
                            "(python -m orchestrator.events publish --run-dir ...)")
            return None
        try:
            self._emulator = (self._emulator_factory or EmulatorProcess)()
            host = self._emulator.start()
        except Exception as exc:
            log.warning("pubsub_emulator_failed", error=str(exc)[:300],
                        fix="the inbox still works; check `gcloud beta emulators pubsub start`")
            self._emulator = None
            return None
        log.info("pubsub_emulator_started", emulator_host=host)
        return replace(cfg, emulator_host=host)

    def close(self) -> None:
        """Stop sources, persist the dedupe window, close the records. Idempotent."""
        if self._inbox is not None:
            self._inbox.stop()
            self._inbox = None
        if self._pubsub is not None:
            self._pubsub.stop()
            self._pubsub = None
        if self._emulator is not None:
            try:
                self._emulator.close()
            finally:
                self._emulator = None
        (self.run_dir / PUBSUB_INFO_FILE).unlink(missing_ok=True)
        if self._dl_publisher is not None:
            try:
                self._dl_publisher.stop()
            except Exception:
                log.debug("dead_letter_publisher_stop_failed")
            self._dl_publisher = None
        if self._started:
            self._dedupe.save()
            for writer in (self._events, self._dead):
                if writer is not None:
                    writer.close()
        self._started = False

    def __enter__(self) -> EventIntake:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- inputs
    def submit(self, payload: bytes | str | dict | Event, *, source: str) -> None:
        """In-process sources (Ray death, forwarded metadata-watcher dicts); never raises."""
        self._ingest(payload, via=f"submit:{source}", source=source, ack=None)

    def _on_inbox_file(self, data: bytes, ack: Callable[[], None], name: str) -> None:
        self._ingest(data, via="inbox", source="inbox", ack=ack, message_id=name)

    def _on_delivery(self, delivery: Delivery) -> None:
        self._ingest(delivery.data, via="pubsub", source="pubsub", ack=delivery.ack,
                     attributes=delivery.attributes, message_id=delivery.message_id)

    def _ingest(self, payload: Any, *, via: str, source: str, ack: Callable[[], None] | None,
                attributes: Mapping[str, str] | None = None, message_id: str | None = None,
                ) -> None:
        ack = ack or _noop
        try:
            now = self._clock()
            try:
                event = self._parse(payload, now=now, source=source)
            except MalformedEvent as exc:
                self._dead_letter(payload, exc, via=via, source=source,
                                  attributes=attributes, message_id=message_id)
                _safe(ack)
                return
            filters = self.cfg.pubsub.filters if via == "pubsub" else None
            verdict = relevance(event, job=self.job, attributes=attributes, filters=filters)
            if not verdict.accepted:
                log.debug("event_irrelevant", id=event.id, reason=verdict.reason, via=via)
                self._record(event, verdict, via=via, received_at=now)
                _safe(ack)
                return
            if event.id in self._dedupe:
                self._record(event, Verdict("duplicate", "already recorded"), via=via,
                             received_at=now, with_raw=False)
                _safe(ack)
                return
            with self._cond:
                self._pending.append(_Pending(event, via, now, ack, dict(attributes or {})))
                self._cond.notify_all()
        except Exception:  # the last line of defence: a source thread must survive any input
            log.exception("event_ingest_failed", via=via)
            self.counts["ingest_errors"] += 1

    def _parse(self, payload: Any, *, now: float, source: str) -> Event:
        if isinstance(payload, Event):
            return payload
        if isinstance(payload, (bytes, bytearray, memoryview, str)):
            return parsing.parse_bytes(bytes(payload) if not isinstance(payload, str) else payload,
                                       now=now, source=source,
                                       max_bytes=self.cfg.pubsub.max_payload_bytes,
                                       notice_s=self.cfg.notice_s)
        if isinstance(payload, Mapping):
            return parsing.parse_value(dict(payload), now=now, source=source,
                                       notice_s=self.cfg.notice_s)
        raise MalformedEvent(f"cannot take a {type(payload).__name__} as an event")

    # ---------------------------------------------------------------- outputs
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until an event is pending."""
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
            return bool(self._pending)

    def poll(self, hosts: Sequence[HostRef], incarnation: int) -> list[Event]:
        """Clean, relevant, deduplicated, current events since the last poll (all recorded)."""
        with self._cond:
            batch, self._pending = self._pending, []
        if not batch:
            return []
        now = self._clock()
        accepted: list[Event] = []
        try:
            for item in batch:
                event = item.event
                if event.id in self._dedupe:
                    verdict = Verdict("duplicate", "already recorded")
                else:
                    verdict = staleness(event, hosts=hosts, incarnation=incarnation, now=now,
                                        grace_s=self.cfg.stale_grace_s)
                self._record(event, verdict, via=item.via, received_at=item.received_at,
                             with_raw=verdict.decision != "duplicate")
                if verdict.decision == "duplicate":
                    continue
                self._dedupe.add(event.id)
                if verdict.accepted:
                    accepted.append(event)
                else:
                    log.info("event_dropped", id=event.id, kind=event.kind.value,
                             reason=verdict.reason)
            if now - self._last_save >= DEDUPE_SAVE_INTERVAL_S:
                self._dedupe.save()
                self._last_save = now
        except Exception:
            # recording failed (disk full?): do not ack; the messages will be redelivered
            log.exception("event_record_failed", fix="check free space in the run directory")
            return accepted
        for item in batch:
            _safe(item.ack or _noop)
        return accepted

    def record_action(self, event: Event, action: str, **details: Any) -> None:
        """Append what the driver/controller did about ``event`` to events.jsonl."""
        if self._events is None:
            return
        try:
            self._events.write({"at": self._clock(), "decision": "action", "event_id": event.id,
                                "kind": event.kind.value, "action": action,
                                "details": raw_for_record(details)})
        except Exception:
            log.exception("event_action_record_failed", id=event.id, action=action)

    @property
    def remembered_ids(self) -> int:
        return len(self._dedupe)

    @property
    def pubsub_config(self) -> PubSubConfig:
        """The effective Pub/Sub settings (with the emulator address when the driver runs one)."""
        return self._pubsub_cfg

    # ---------------------------------------------------------------- records
    def _record(self, event: Event, verdict: Verdict, *, via: str, received_at: float,
                with_raw: bool = True) -> None:
        self.counts[verdict.decision] += 1
        assert self._events is not None, "EventIntake.start() was not called"
        body = event.to_json(with_raw=False)
        if with_raw and event.raw is not None:
            body["raw"] = raw_for_record(event.raw)
        self._events.write({"at": self._clock(), "received_at": received_at,
                            "decision": verdict.decision, "reason": verdict.reason,
                            "via": via, "event": body})

    def _dead_letter(self, payload: Any, exc: MalformedEvent, *, via: str, source: str,
                     attributes: Mapping[str, str] | None, message_id: str | None) -> None:
        self.counts["dead_letter"] += 1
        log.warning("event_dead_letter", via=via, reason=exc.reason[:300], message_id=message_id)
        assert self._dead is not None, "EventIntake.start() was not called"
        self._dead.write({"at": self._clock(), "via": via, "source": source,
                          "reason": exc.reason, "fix": exc.fix, "message_id": message_id,
                          "attributes": dict(attributes or {}),
                          "payload": raw_for_record(payload if not isinstance(payload, Event)
                                                    else payload.to_json())})
        if self.cfg.pubsub.dead_letter_topic:
            self._publish_dead_letter(payload, exc.reason, message_id)

    def _publish_dead_letter(self, payload: Any, reason: str, message_id: str | None) -> None:
        cfg = self._pubsub_cfg
        try:
            if isinstance(payload, (bytes, bytearray, memoryview)):
                data = bytes(payload)
            elif isinstance(payload, str):
                data = payload.encode("utf-8", "replace")
            else:
                data = json.dumps(raw_for_record(payload), default=repr).encode("utf-8")
            data = data[: 10 * 1024 * 1024 - 1024]
            if self._dl_publisher is None:
                self._dl_publisher = self._publisher_factory(cfg)
            topic = self._dl_publisher.topic_path(cfg.project, cfg.dead_letter_topic)
            future = self._dl_publisher.publish(
                topic, data, dead_letter_reason=reason[:1000], job=self.job,
                original_message_id=message_id or "")
            future.result(timeout=10)
        except Exception as exc:
            log.warning("dead_letter_publish_failed", error=str(exc)[:300],
                        fix="check events.pubsub.dead_letter_topic exists; the dead letter is "
                            "still in dead_letters.jsonl")


def _safe(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:
        log.warning("event_ack_failed", error=str(exc)[:200])


def _env_emulator() -> str | None:
    return os.environ.get("PUBSUB_EMULATOR_HOST") or None
