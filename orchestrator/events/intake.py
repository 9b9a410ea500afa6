"""The event intake: every source in, clean events out, everything recorded.

Threads: the Pub/Sub supervisor and the inbox watcher parse in their own threads; malformed
payloads become dead letters and irrelevant ones are recorded and acknowledged right there.
Relevant events wait in a queue until the driver calls ``poll(hosts, incarnation)``, which drops
duplicates and stale events (with the reason), records each one in events.jsonl, fsyncs it, and
only then acknowledges the messages they came from. Only *accepted* ids enter the dedupe window:
a stale verdict (a host not in the mesh yet, say) is not permanent. Events accepted by a driver
that crashed before acting on them come back through ``replay_unhandled``. Nothing raises into
the driver: a failure in a source is logged and the source retries.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from orchestrator.events import parsing
from orchestrator.events.config import EventsConfig, PubSubConfig
from orchestrator.events.deadletters import DeadLetterPublisher
from orchestrator.events.dedupe import DedupeWindow
from orchestrator.events.eventlog import (
    JsonlWriter,
    raw_for_record,
    read_log,
    recent_event_ids,
)
from orchestrator.events.inbox import PUBLISH_FIX, InboxWatcher
from orchestrator.events.model import Event, MalformedEvent
from orchestrator.events.pubsub_side import PUBSUB_INFO_FILE as PUBSUB_INFO_FILE  # re-export
from orchestrator.events.pubsub_side import PubSubSide
from orchestrator.events.pubsub_source import (
    Delivery,
    PubSubSource,
    make_publisher,
    make_subscriber,
)
from orchestrator.events.relevance import Verdict, relevance, staleness
from orchestrator.events.replay import kept_out, unhandled_events
from orchestrator.shared.hosts import HostRef

log = structlog.get_logger(__name__)

EVENTS_FILE = "events.jsonl"
DEAD_LETTERS_FILE = "dead_letters.jsonl"
DEDUPE_FILE = "event_dedupe.json"
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
        self._publisher_factory = publisher_factory
        self._side = PubSubSide(cfg.pubsub.for_job(job),  # bad settings fail here, not later
                                run_dir=self.run_dir, job=job, on_delivery=self._on_delivery,
                                subscriber_factory=subscriber_factory,
                                publisher_factory=publisher_factory,
                                emulator_factory=emulator_factory)
        self._pending: list[_Pending] = []
        self._cond = threading.Condition()
        self._dedupe = DedupeWindow(cfg.dedupe_window, self.run_dir / DEDUPE_FILE)
        self._events: JsonlWriter | None = None
        self._dead: JsonlWriter | None = None
        self._inbox: InboxWatcher | None = None
        self._dl_publisher: Any = None
        self._last_save = 0.0
        self._started = False
        self._start_seq = 0  # events.jsonl lines up to here were written by earlier drivers
        self.counts: Counter[str] = Counter()
        self.id_to_name: dict[str, str] = {}  # GCE instance id -> name, from the hosts
        self._observers: list[Callable[[Event, Sequence[HostRef]], None]] = []

    def add_observer(self, fn: Callable[[Event, Sequence[HostRef]], None]) -> None:
        """Also hand each accepted event (and the hosts it was resolved against) to ``fn``,
        after it is recorded: the emulated cloud reclaims the slices a notice names. An
        observer that raises is logged and skipped."""
        self._observers.append(fn)

    @property
    def _pubsub(self) -> PubSubSource | None:
        """The running Pub/Sub source, if any."""
        return self._side.source

    def set_instance_ids(self, id_to_name: Mapping[str, str]) -> None:
        """The id -> name map the hosts read from their metadata servers (targets events that
        name an instance only by its numeric id)."""
        self.id_to_name = {str(k): str(v) for k, v in id_to_name.items()}

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Open the records, reload the dedupe window, start the background sources."""
        if self._started:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._events = JsonlWriter(self.run_dir / EVENTS_FILE)
        self._dead = JsonlWriter(self.run_dir / DEAD_LETTERS_FILE)
        self._dedupe.load(recent_event_ids(self.run_dir / EVENTS_FILE))
        self._start_seq = self._events.seq
        self._started = True
        if self.cfg.inbox_on:
            self._inbox = InboxWatcher(self.run_dir, self._on_inbox_file,
                                       refuse=self._on_inbox_refused,
                                       poll_s=self.cfg.inbox_poll_s,
                                       max_bytes=self.cfg.pubsub.max_payload_bytes)
            self._inbox.start()
        elif self.cfg.inbox is None:
            log.info("event_inbox_off", reason="Pub/Sub is configured",
                     fix="set events.inbox=true to also take RUN_DIR/inbox files")
        if (fix := self.cfg.pubsub.shared_subscription_fix(self.job)) is not None:
            log.warning("pubsub_subscription_not_per_run", job=self.job,
                        subscription=self.cfg.pubsub.subscription, fix=fix)
        self._side.start()
        log.info("event_intake_started", run_dir=str(self.run_dir), job=self.job,
                 inbox=self.cfg.inbox_on, pubsub=self._pubsub is not None,
                 remembered_ids=len(self._dedupe))

    def close(self) -> None:
        """Stop sources, persist the dedupe window, close the records. Idempotent."""
        if self._inbox is not None:
            self._inbox.stop()
            self._inbox = None
        self._side.stop()
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

    def _on_inbox_refused(self, data: bytes, reason: str, name: str) -> None:
        """A file the inbox refused (not the run user's): a dead letter, never an event."""
        try:
            self._dead_letter(data, MalformedEvent(reason, fix=PUBLISH_FIX), via="inbox",
                              source="inbox", attributes=None, message_id=name)
            if self._dead is not None:
                self._dead.sync()
        except Exception:
            log.exception("event_dead_letter_failed", via="inbox", message_id=name)

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
                self._ack_durably(ack, self._dead)
                return
            if event.labels.get("parse.ignored"):
                log.info("event_fields_ignored", id=event.id, via=via,
                         notes=event.labels["parse.ignored"][:500])
            filters = self.cfg.pubsub.filters if via == "pubsub" else None
            verdict = relevance(event, job=self.job, attributes=attributes, filters=filters)
            if not verdict.accepted:
                log.debug("event_irrelevant", id=event.id, reason=verdict.reason, via=via)
                self._record(event, verdict, via=via, received_at=now)
                self._ack_durably(ack, self._events)
                return
            if event.id in self._dedupe:
                self._record(event, Verdict("duplicate", "already recorded"), via=via,
                             received_at=now, with_raw=False)
                self._ack_durably(ack, self._events)
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
                                       notice_s=self.cfg.notice_s,
                                       max_depth=self.cfg.max_payload_depth)
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

    def poll(self, hosts: Sequence[HostRef], incarnation: int, *,
             id_to_name: Mapping[str, str] | None = None) -> list[Event]:
        """Clean, relevant, deduplicated, current events since the last poll (all recorded and
        fsynced before their messages are acknowledged). ``hosts``: every host a notice may
        name (mesh and spares); ``id_to_name`` overrides ``set_instance_ids``."""
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
                                        grace_s=self.cfg.stale_grace_s,
                                        id_to_name=self.id_to_name if id_to_name is None
                                        else id_to_name, cluster=self.cfg.cluster)
                self._record(event, verdict, via=item.via, received_at=item.received_at,
                             with_raw=verdict.decision != "duplicate")
                if verdict.accepted:
                    self._dedupe.add(event.id)  # only handled events: stale may come again
                    accepted.append(event)
                elif verdict.decision != "duplicate":
                    log.info("event_dropped", id=event.id, kind=event.kind.value,
                             reason=verdict.reason)
            assert self._events is not None
            self._events.sync()  # durable before any ack: a crash now loses nothing
            if now - self._last_save >= DEDUPE_SAVE_INTERVAL_S:
                self._dedupe.save()
                self._last_save = now
        except Exception:
            # recording failed (disk full?): do not ack; the messages will be redelivered
            log.exception("event_record_failed", fix="check free space in the run directory")
            return accepted
        for item in batch:
            _safe(item.ack or _noop)
        for event in accepted:
            for fn in self._observers:
                try:
                    fn(event, hosts)
                except Exception:
                    log.exception("event_observer_failed", id=event.id)
        return accepted

    def record_action(self, event: Event, action: str, *, outcome: bool = True,
                      **details: Any) -> None:
        """Append what the driver/controller did about ``event`` to events.jsonl. ``outcome``:
        the action settles the event (``replay_unhandled`` stops returning it); False for a
        decision not yet carried out (a drain decided, a stop asked). Fsynced when it settles."""
        if self._events is None:
            return
        try:
            self._events.write({"at": self._clock(), "decision": "action", "event_id": event.id,
                                "kind": event.kind.value, "action": action, "outcome": outcome,
                                "details": raw_for_record(details)})
            if outcome:
                self._events.sync()
        except Exception:
            log.exception("event_action_record_failed", id=event.id, action=action)

    def replay_unhandled(self, now: float) -> list[Event]:
        """Events an earlier driver accepted (and acknowledged) but never recorded an outcome
        for, not expired (a maintenance window: its end), oldest first; returned again by
        every driver until one records an outcome (``replay.py``). Never raises."""
        try:
            records = read_log(self.run_dir / EVENTS_FILE)
            return unhandled_events(records, upto_seq=self._start_seq if self._started else None,
                                    now=now, grace_s=self.cfg.stale_grace_s)
        except Exception:
            log.exception("event_replay_failed", run_dir=str(self.run_dir))
            return []

    def replay_kept_out(self, now: float) -> dict[str, float]:
        """Node ids earlier drivers drained or kept out for notices not expired at ``now``:
        ``{node_id: expiry}`` (``replay.kept_out``). Never raises."""
        try:
            return kept_out(read_log(self.run_dir / EVENTS_FILE), now=now,
                            grace_s=self.cfg.stale_grace_s)
        except Exception:
            log.exception("event_replay_failed", run_dir=str(self.run_dir))
            return {}

    @property
    def remembered_ids(self) -> int:
        return len(self._dedupe)

    @property
    def pubsub_config(self) -> PubSubConfig:
        """The effective Pub/Sub settings (with the emulator address when the driver runs one)."""
        return self._side.cfg

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
            if self._dl_publisher is None:
                self._dl_publisher = DeadLetterPublisher(self._side.cfg, self.job,
                                                         self._publisher_factory)
            self._dl_publisher.publish(payload, exc.reason, message_id)

    def _ack_durably(self, ack: Callable[[], None], writer: JsonlWriter | None) -> None:
        """fsync what was just written, then ack; a real message is never acked unrecorded.
        In-process submissions (no ack) skip the fsync: nothing would be redelivered anyway."""
        if ack is _noop:
            return
        try:
            if writer is not None:
                writer.sync()
        except Exception:
            log.exception("event_record_sync_failed",
                          fix="check free space in the run directory; the message stays unacked")
            return
        _safe(ack)


def _safe(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:
        log.warning("event_ack_failed", error=str(exc)[:200])

