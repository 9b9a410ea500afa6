"""Trace replay: the run's own event-log format in, clear errors for lines that cannot be."""

from __future__ import annotations

import json

import pytest

from orchestrator.sim.runner import simulate
from orchestrator.sim.trace import TraceError, read_trace
from tests.sim.helpers import STARTUP, tiny

T0 = 1_700_000_000.0


def _event(id_: str, kind: str, at: float, **extra) -> dict:
    return {"schema_version": 1, "id": id_, "kind": kind, "source": "metadata",
            "observed_at": at, "target": extra.pop("target", {"job": "old-run"}), **extra}


def _write(path, lines) -> str:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


@pytest.mark.parametrize(("line", "says", "fix"), [
    ("{not json", "is not JSON", "one JSON object per line"),
    ("[1, 2]", "not an object", "one JSON object per line"),
    (json.dumps(_event("e1", "meteor_strike", T0)), "unknown kind", "use one of"),
    (json.dumps({"decision": "accepted", "event": "x"}), "not an object", "as an object"),
    (json.dumps({**_event("e1", "preemption", T0), "schema_version": 9}),
     "unsupported schema_version", "schema_version 1"),
])
def test_a_bad_line_names_the_file_line_and_fix(tmp_path, line, says, fix):
    good = json.dumps(_event("e0", "live_migration", T0))
    path = _write(tmp_path / "t.jsonl", [good, line])
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert f"{path}:2" in err.value.message and says in err.value.message
    assert fix in err.value.fix


def test_an_empty_trace_is_refused(tmp_path):
    with pytest.raises(TraceError, match="holds no events"):
        read_trace(_write(tmp_path / "t.jsonl", [""]))


def test_an_events_jsonl_is_read_without_actions_and_duplicates(tmp_path):
    ev = _event("n1", "preemption_notice", T0 + 5, deadline=T0 + 35,
                target={"job": "old-run", "host": "vm-a", "host_kind": "instance"})
    lines = [{"seq": 1, "at": T0 + 5, "received_at": T0 + 5, "decision": "accepted",
              "reason": "", "via": "pubsub", "event": ev},
             {"seq": 2, "at": T0 + 5, "decision": "action", "event_id": "n1",
              "kind": "preemption_notice", "action": "drain_now", "details": {}},
             {"seq": 3, "at": T0 + 6, "received_at": T0 + 6, "decision": "duplicate",
              "reason": "already recorded", "via": "metadata", "event": ev}]
    traced = read_trace(_write(tmp_path / "events.jsonl", lines))
    assert [t.event.id for t in traced] == ["n1"]
    assert traced[0].event.deadline == T0 + 35


def test_a_replayed_notice_drains_and_its_slice_goes_at_the_deadline(tmp_path):
    ev = _event("n1", "preemption_notice", T0, deadline=T0 + 30,
                target={"job": "old-run", "host": "vm-a", "host_kind": "instance"})
    path = _write(tmp_path / "events.jsonl", [ev])
    r = simulate(tiny("horizon_h=0.1", "topology.spare_slices=1", f"trace.path={path}",
                      f"trace.start_offset_s={STARTUP + 25.5}"), run_dir=tmp_path / "run")
    assert r.happenings["preemption_notice"] == 1 and r.happenings["preempted"] == 1
    assert r.recoveries["announced:spot_preemption"]["count"] == 1
    assert r.lost_steps == 0
    records = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(x.get("action") == "drain_now" for x in records)


def test_a_host_named_by_mesh_index_is_the_host_at_that_index_when_the_event_arrives(tmp_path):
    """Our CLI's `--host 1` twice: each notice names host 1 of the mesh of its moment, so the
    second one drains the group that moved to a spare (replayed by fixed position, it named a
    host outside the mesh and was only noted)."""
    evs = [_event(f"n{i}", "preemption_notice", T0 + 60 * i, deadline=T0 + 60 * i + 30,
                  source="cli", target={"host": "1"}) for i in range(2)]
    path = _write(tmp_path / "events.jsonl", evs)
    r = simulate(tiny("horizon_h=0.1", "topology.spare_slices=2", f"trace.path={path}",
                      f"trace.start_offset_s={STARTUP + 25.5}"), run_dir=tmp_path / "run")
    assert r.happenings["preemption_notice"] == 2 and r.happenings["preempted"] == 2
    assert r.recoveries["announced:spot_preemption"]["count"] == 2
    records = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [x["action"] for x in records if x.get("decision") == "action"
            and x["action"] in ("drain_now", "note")] == ["drain_now", "drain_now"]
