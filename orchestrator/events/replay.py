"""Accepted-but-unhandled events in an events.jsonl, for a driver restarting after a crash.

The intake acknowledges a message once its "accepted" line is fsynced; the controller then acts
and records an "action" line. A crash between the two leaves an accepted event with no action: it
was acknowledged (no redelivery) and its id is in the dedupe window (a redelivery would be
dropped), so only this log can bring it back. Pure: records and ``now`` in, events out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog

from orchestrator.events.model import Event, MalformedEvent
from orchestrator.events.relevance import expires_at

log = structlog.get_logger(__name__)


def unhandled_events(records: Iterable[dict[str, Any]], *, upto_seq: int | None, now: float,
                     grace_s: float = 0.0) -> list[Event]:
    """Events accepted by earlier drivers (lines with ``seq <= upto_seq``) with no action line
    (from any driver) and not expired at ``now``, in the order they were accepted."""
    accepted: dict[str, dict[str, Any]] = {}
    handled: set[str] = set()
    for record in records:
        seq = record.get("seq")
        earlier = upto_seq is None or not isinstance(seq, int) or seq <= upto_seq
        decision = record.get("decision")
        if decision == "action" and isinstance(record.get("event_id"), str):
            handled.add(record["event_id"])  # by any driver, this one included
        elif decision == "accepted" and earlier and isinstance(record.get("event"), dict):
            body = record["event"]
            if isinstance(body.get("id"), str):
                accepted.setdefault(body["id"], body)
    out: list[Event] = []
    for event_id, body in accepted.items():
        if event_id in handled:
            continue
        try:
            event = Event.from_json(body, now=now)
        except MalformedEvent as exc:
            log.warning("event_replay_unreadable", id=event_id[:80], reason=exc.reason)
            continue
        expiry = expires_at(event)
        if expiry is not None and now > expiry + grace_s:
            log.info("event_replay_expired", id=event_id[:80], kind=event.kind.value)
            continue
        out.append(event)
    if out:
        log.info("events_unhandled_by_earlier_driver", count=len(out),
                 ids=[e.id[:80] for e in out[:20]])
    return out
