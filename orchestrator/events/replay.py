"""Accepted-but-unsettled events in an events.jsonl, for a driver restarting after a crash.

The intake acknowledges a message once its "accepted" line is fsynced; the controller then
decides (an "action" line with ``"outcome": false``: ``drain_now``, ``stop``, ``deferred``, ...)
and, once the decision has taken effect, records its outcome (``"outcome": true``: ``saved``,
``drained``, ``excluded``, ``stopped``, ``note``, ``ignore``, ...). A driver that dies in
between leaves an event that was acknowledged (no redelivery) and is in the dedupe window (a
redelivery would be dropped), so only this log can bring it back: it is replayed until an
outcome is recorded or it expires. An action line without the ``outcome`` key was written
before outcomes were recorded and counts as one, as it did then.

A drain's outcome also says which hosts it kept out of the mesh (``details.hosts``, node ids);
until the notice expires, a later driver keeps them out too (``kept_out``). Pure: records and
``now`` in, events out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog

from orchestrator.events.model import Event, MalformedEvent
from orchestrator.events.relevance import expires_at

log = structlog.get_logger(__name__)

KEEPS_OUT = frozenset({"saved", "drained", "excluded", "stopped"})
"""Outcomes that left the event's hosts out of the next mesh."""


def is_outcome(record: dict[str, Any]) -> bool:
    """An action line that settles its event (legacy lines without the key do)."""
    return record.get("decision") == "action" and record.get("outcome", True) is not False


def unhandled_events(records: Iterable[dict[str, Any]], *, upto_seq: int | None, now: float,
                     grace_s: float = 0.0) -> list[Event]:
    """Events accepted by earlier drivers (lines with ``seq <= upto_seq``) with no outcome
    (from any driver) and not expired at ``now`` (+ ``grace_s``), in the order accepted."""
    accepted, settled = _accepted_and_settled(records, upto_seq=upto_seq)
    out: list[Event] = []
    for event_id, body in accepted.items():
        if event_id in settled:
            continue
        event = _event(event_id, body, now)
        if event is None:
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


def kept_out(records: Iterable[dict[str, Any]], *, now: float,
             grace_s: float = 0.0) -> dict[str, float]:
    """Node ids an earlier driver kept out of its mesh for a notice that has not expired
    at ``now``: ``{node_id: expiry}`` (the latest expiry when several notices name one)."""
    records = list(records)
    accepted, _ = _accepted_and_settled(records, upto_seq=None)
    out: dict[str, float] = {}
    for record in records:
        if not is_outcome(record) or record.get("action") not in KEEPS_OUT:
            continue
        body = accepted.get(record.get("event_id"))  # type: ignore[arg-type]
        details = record.get("details")
        hosts = details.get("hosts") if isinstance(details, dict) else None
        if body is None or not isinstance(hosts, list):
            continue
        event = _event(str(record["event_id"]), body, now)
        expiry = expires_at(event) if event is not None else None
        if expiry is None or now > expiry + grace_s:
            continue
        for node in hosts:
            if isinstance(node, str):
                out[node] = max(out.get(node, expiry), expiry)
    return out


def _accepted_and_settled(records: Iterable[dict[str, Any]], *, upto_seq: int | None,
                          ) -> tuple[dict[str, dict[str, Any]], set[str]]:
    accepted: dict[str, dict[str, Any]] = {}
    settled: set[str] = set()
    for record in records:
        seq = record.get("seq")
        earlier = upto_seq is None or not isinstance(seq, int) or seq <= upto_seq
        decision = record.get("decision")
        if is_outcome(record) and isinstance(record.get("event_id"), str):
            settled.add(record["event_id"])  # by any driver, this one included
        elif decision == "accepted" and earlier and isinstance(record.get("event"), dict):
            body = record["event"]
            if isinstance(body.get("id"), str):
                accepted.setdefault(body["id"], body)
    return accepted, settled


def _event(event_id: str, body: dict[str, Any], now: float) -> Event | None:
    try:
        return Event.from_json(body, now=now)
    except MalformedEvent as exc:
        log.warning("event_replay_unreadable", id=event_id[:80], reason=exc.reason)
        return None
