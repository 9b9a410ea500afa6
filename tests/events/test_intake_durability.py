"""Issue-11 intake holes: stale is not permanent, acks wait for fsync, unhandled events replay."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.events import eventlog
from orchestrator.events.config import EventsConfig
from orchestrator.events.intake import EventIntake
from orchestrator.events.model import EventKind
from orchestrator.events.pubsub_source import Delivery
from tests.events.helpers import event, hosts, lines

NOW = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def intake(tmp_path, clock=None, **cfg) -> EventIntake:
    it = EventIntake(EventsConfig(inbox=False, **cfg), run_dir=tmp_path, job="demo",
                     clock=clock or Clock())
    it.start()
    return it


def delivery(doc: dict, acks: list, name: str = "m1") -> Delivery:
    return Delivery(data=json.dumps(doc).encode(), attributes={}, message_id=name,
                    publish_time=None, ack=lambda: acks.append(("ack", name)),
                    nack=lambda: acks.append(("nack", name)))


def notice(host: str, id: str = "replacement-notice", deadline: float = NOW + 30) -> dict:
    return {"schema_version": 1, "id": id, "kind": "preemption", "deadline": deadline,
            "target": {"host": host, "host_kind": "instance"}}


def test_stale_verdict_is_not_permanent(tmp_path):
    """A notice for a host not yet in the mesh is stale; the same id later (the replacement has
    joined) is accepted, in this driver and after a restart."""
    it = intake(tmp_path)
    it.submit(notice("vm-5"), source="t")
    assert it.poll(hosts(2), 0) == []  # vm-5 is not in the mesh yet
    it.submit(notice("vm-5"), source="t")
    mesh = [*hosts(2), replace(hosts(6)[5])]
    assert [e.id for e in it.poll(mesh, 0)] == ["replacement-notice"]
    it.submit(notice("vm-5"), source="t")  # now it *is* a duplicate
    assert it.poll(mesh, 0) == []
    it.close()
    decisions = [r["decision"] for r in lines(tmp_path / "events.jsonl")]
    assert decisions == ["stale", "accepted", "duplicate"]


def test_stale_ids_are_not_remembered_across_a_restart(tmp_path):
    """The dedupe window rebuilt from events.jsonl holds only accepted ids."""
    it = intake(tmp_path)
    it.submit(notice("vm-5"), source="t")
    it.poll(hosts(2), 0)
    it.close()
    again = intake(tmp_path)
    again.submit(notice("vm-5"), source="t")
    assert [e.id for e in again.poll(hosts(6), 0)] == ["replacement-notice"]
    again.close()


@pytest.fixture
def fsyncs(monkeypatch):
    """Record every fsync the event log makes, in order with the acks."""
    order: list[tuple[str, str]] = []
    real = eventlog.os.fsync

    def spy(fd):
        order.append(("fsync", ""))
        return real(fd)

    monkeypatch.setattr(eventlog.os, "fsync", spy)
    return order


def test_pubsub_message_is_acked_only_after_its_line_is_fsynced(tmp_path, fsyncs):
    """poll(): write the accepted line, fsync, then ack; a crash before the fsync loses no
    acknowledged message."""
    it = intake(tmp_path)
    it._on_delivery(delivery(notice("vm-1", id="n1"), fsyncs, "m1"))
    assert ("ack", "m1") not in fsyncs  # queued, not yet recorded
    got = it.poll(hosts(2), 0)
    assert [e.id for e in got] == ["n1"]
    ack_at = fsyncs.index(("ack", "m1"))
    assert ("fsync", "") in fsyncs[:ack_at]
    on_disk = lines(tmp_path / "events.jsonl")
    assert on_disk[-1]["decision"] == "accepted"
    it.close()


@pytest.mark.parametrize("payload", [b"{not json", json.dumps(
    {"schema_version": 1, "id": "x", "kind": "stop", "target": {"job": "other"}}).encode()])
def test_dead_letters_and_irrelevant_are_fsynced_before_the_ack(tmp_path, fsyncs, payload):
    """The other ack paths (dead letter, irrelevant) fsync first too."""
    it = intake(tmp_path)
    it._on_delivery(Delivery(data=payload, attributes={}, message_id="m9", publish_time=None,
                             ack=lambda: fsyncs.append(("ack", "m9")), nack=lambda: None))
    assert fsyncs[-2:] == [("fsync", ""), ("ack", "m9")]
    it.close()


def test_replay_unhandled_returns_accepted_events_without_an_action(tmp_path):
    """Crash between accept (acked) and action: the next driver gets the event back; handled,
    expired and stale ones are not returned."""
    clock = Clock()
    first = intake(tmp_path, clock)
    for doc in (notice("vm-1", id="handled"), notice("vm-1", id="lost-in-crash"),
                notice("vm-1", id="expires", deadline=NOW + 5),
                notice("vm-9", id="stale"),
                {"schema_version": 1, "id": "stop-1", "kind": "stop"}):
        first.submit(doc, source="t")
    got = {e.id: e for e in first.poll(hosts(2), 0)}
    assert set(got) == {"handled", "lost-in-crash", "expires", "stop-1"}
    first.record_action(got["handled"], "drain")
    # the driver dies here: no close(), no actions for the rest
    clock.t = NOW + 10
    second = intake(tmp_path, clock)
    replayed = second.replay_unhandled(clock.t)
    assert [e.id for e in replayed] == ["lost-in-crash", "stop-1"]
    assert replayed[0].kind is EventKind.PREEMPTION_NOTICE and replayed[0].deadline == NOW + 30
    second.submit(notice("vm-1", id="lost-in-crash"), source="t")  # a redelivery: duplicate
    assert second.poll(hosts(2), 0) == []
    for ev in replayed:
        second.record_action(ev, "drain")
    assert second.replay_unhandled(clock.t) == []  # handled now, by this driver
    second.close()
    third = intake(tmp_path, clock)
    assert third.replay_unhandled(clock.t) == []  # handled by the second driver
    third.close()


def test_replay_skips_a_maintenance_window_that_ended(tmp_path):
    """A maintenance notice stays replayable until its window ends, not its start."""
    clock = Clock()
    first = intake(tmp_path, clock)
    ev = replace(event(EventKind.MAINTENANCE_SCHEDULED, host="vm-1", id="mw"),
                 deadline=NOW + 100, window_start=NOW + 100, window_end=NOW + 200,
                 observed_at=NOW)
    first.submit(ev, source="t")
    assert [e.id for e in first.poll(hosts(2), 0)] == ["mw"]
    second = intake(tmp_path, clock)
    assert [e.id for e in second.replay_unhandled(NOW + 150)] == ["mw"]
    assert second.replay_unhandled(NOW + 250) == []
    second.close()


def test_replay_never_raises_on_a_damaged_log(tmp_path):
    """Garbage lines and unreadable events are skipped."""
    (tmp_path / "events.jsonl").write_text(
        'not json\n{"seq": 1, "decision": "accepted", "event": {"id": "x"}}\n'
        '{"seq": 2, "decision": "accepted", "event": "oops"}\n')
    it = intake(tmp_path)
    assert it.replay_unhandled(NOW) == []
    it.close()
