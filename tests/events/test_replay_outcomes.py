"""Replay until the outcome is durable (issue 28, item 5): a decision line does not settle an
event, an outcome line does; a drain's outcome keeps its hosts out until the notice expires."""

from __future__ import annotations

from orchestrator.events.replay import kept_out, unhandled_events

NOW = 1_800_000_000.0


def accepted(seq: int, event_id: str, *, deadline: float | None = NOW + 30,
             kind: str = "preemption_notice") -> dict:
    body = {"schema_version": 1, "id": event_id, "kind": kind, "source": "test",
            "target": {"job": "demo", "host": "vm-1"}, "observed_at": NOW - 1}
    if deadline is not None:
        body["deadline"] = deadline
    return {"seq": seq, "decision": "accepted", "event": body}


def action(seq: int, event_id: str, name: str, outcome: bool | None, **details) -> dict:
    line = {"seq": seq, "decision": "action", "event_id": event_id, "action": name,
            "details": details}
    if outcome is not None:
        line["outcome"] = outcome
    return line


def ids(records, now: float = NOW) -> list[str]:
    return [e.id for e in unhandled_events(records, upto_seq=None, now=now)]


def test_a_decision_without_an_outcome_is_replayed():
    """accepted + drain_now (outcome false), then the driver died: replayed."""
    assert ids([accepted(1, "n1"), action(2, "n1", "drain_now", False)]) == ["n1"]


def test_an_outcome_settles_the_event():
    records = [accepted(1, "n1"), action(2, "n1", "drain_now", False),
               action(3, "n1", "saved", True, hosts=["node-1"])]
    assert ids(records) == []


def test_a_deferred_decision_is_replayed_and_an_expired_event_is_not():
    records = [accepted(1, "mw", deadline=NOW + 86400), action(2, "mw", "deferred", False),
               accepted(3, "old", deadline=NOW - 60), action(4, "old", "drain_now", False)]
    assert ids(records) == ["mw"]


def test_a_stop_is_replayed_until_stopped_and_never_expires():
    records = [accepted(1, "s1", deadline=None, kind="operator_stop"),
               action(2, "s1", "stop", False)]
    assert ids(records, now=NOW + 10 * 86400) == ["s1"]
    assert ids([*records, action(3, "s1", "stopped", True)]) == []


def test_an_action_line_of_an_older_driver_counts_as_settled():
    """Lines without the ``outcome`` key predate outcomes: read as they were then (a stop acted
    on by an old driver must not stop the resumed run)."""
    assert ids([accepted(1, "s1", deadline=None, kind="operator_stop"),
                action(2, "s1", "stop", None)]) == []


def test_drained_hosts_stay_out_until_the_notice_expires():
    records = [accepted(1, "n1", deadline=NOW + 30), action(2, "n1", "drain_now", False),
               action(3, "n1", "saved", True, hosts=["node-1", "node-2"]),
               accepted(4, "n2", deadline=NOW + 90),
               action(5, "n2", "excluded", True, hosts=["node-2"]),
               accepted(6, "n3", deadline=NOW + 30),
               action(7, "n3", "note", True, hosts=["node-3"])]  # a note keeps nothing out
    assert kept_out(records, now=NOW) == {"node-1": NOW + 30, "node-2": NOW + 90}
    assert kept_out(records, now=NOW + 60) == {"node-2": NOW + 90}
    assert kept_out(records, now=NOW + 120) == {}
    assert kept_out(records[:2], now=NOW) == {}  # decided, not carried out: replay does it
