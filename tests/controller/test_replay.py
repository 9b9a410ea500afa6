"""A notice a previous driver accepted but never settled (it died between the decision and its
outcome) is decided again by the next driver before its first mesh, so the doomed hosts stay
out of it (issue 28, item 5)."""

from __future__ import annotations

from orchestrator.config import load_config
from orchestrator.events.intake import EventIntake
from tests.controller.fakes import FakeClock, FakeCluster
from tests.controller.harness import BASE, make


def _dead_driver(tmp_path, *actions: tuple[str, bool, dict], ago_s: float = 0.0) -> None:
    """What a driver killed mid-run leaves in events.jsonl: the notice for host vm-s0-0 (its
    deadline 14 s after it came, ``ago_s`` before the next driver starts) accepted and acked,
    then ``actions`` (name, outcome, details), then nothing."""
    cfg = load_config(None, BASE)
    cluster = FakeCluster(slices=("s0", "s1"))
    clock = FakeClock(FakeClock().now() - ago_s)  # the next driver's clock starts at FakeClock()
    deadline_in = 14.0
    intake = EventIntake(cfg.events, run_dir=tmp_path / "run", job="default", clock=clock.now)
    intake.start()
    intake.submit({"schema_version": 1, "kind": "preemption_notice", "id": "doomed",
                   "target": {"job": "default", "host": "vm-s0-0"},
                   "deadline": clock.now() + deadline_in, "source": "test"}, source="test")
    [event] = intake.poll(cluster.hosts(), 1)
    for name, outcome, details in actions:
        intake.record_action(event, name, outcome=outcome, **details)
    intake.close()


def _actions(sim, event_id: str = "doomed") -> list[tuple[str, bool]]:
    return [(e["action"], e.get("outcome", True)) for e in sim.events()
            if e.get("decision") == "action" and e.get("event_id") == event_id]


def _first_mesh_slices(sim) -> set[str]:
    return {h.slice_name for h in sim.fleet.groups[0].spec.plan.hosts}


def test_a_notice_accepted_but_never_decided_keeps_its_host_out_of_the_first_mesh(tmp_path):
    """Killed between the ack and any action: the next driver forms on the free slice at once
    (not on the doomed one, then drains it)."""
    _dead_driver(tmp_path)
    sim = make(tmp_path, spare=("s1",))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert _first_mesh_slices(sim) == {"s1"} and len(sim.fleet.groups) == 1
    assert ("excluded", True) in _actions(sim)


def test_a_drain_decided_but_never_carried_out_is_replayed(tmp_path):
    """Killed 15 ms after ``drain_now`` was logged, the deadline 14 s away: the decision is not
    the outcome, so the next driver replays the notice and keeps the doomed host out."""
    _dead_driver(tmp_path, ("drain_now", False, {"hosts": ["s0-h0"]}))
    sim = make(tmp_path, spare=("s1",))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert _first_mesh_slices(sim) == {"s1"}
    assert _actions(sim)[-1] == ("excluded", True)


def test_a_drain_that_saved_keeps_its_host_out_until_the_deadline(tmp_path):
    """Killed after the drain saved (its outcome recorded) but before the deadline: the notice
    is settled (not replayed), and the host it drained stays out of the next mesh."""
    _dead_driver(tmp_path, ("drain_now", False, {}), ("saved", True, {"hosts": ["s0-h0"]}))
    sim = make(tmp_path, spare=("s1",))
    assert sim.run().state == "SUCCEEDED"
    assert _first_mesh_slices(sim) == {"s1"}
    assert _actions(sim) == [("drain_now", False), ("saved", True)]  # nothing decided again


def test_a_settled_notice_past_its_deadline_keeps_nothing_out(tmp_path):
    """The deadline passed: the host is back in the placement (the notice was settled)."""
    _dead_driver(tmp_path, ("saved", True, {"hosts": ["s0-h0"]}), ago_s=3600.0)
    sim = make(tmp_path, spare=("s1",))
    assert sim.run().state == "SUCCEEDED"
    assert _first_mesh_slices(sim) == {"s0"}


def test_a_drain_records_its_decision_then_its_outcome(tmp_path):
    """In a live run: ``drain_now`` (outcome false) when decided, ``saved`` with the hosts
    kept out (outcome true) once the drain's save committed."""
    sim = make(tmp_path, "controller.warm.handover_max_s=0", spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-1", deadline_in=60.0, id="n1"))
    assert sim.run().state == "SUCCEEDED"
    actions = [e for e in sim.events() if e.get("event_id") == "n1"]
    assert [(a["action"], a["outcome"]) for a in actions] == [
        ("drain_now", False), ("drain:save", False), ("saved", True)]
    assert actions[-1]["details"]["hosts"] == ["s0-h1"]
