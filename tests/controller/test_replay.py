"""A notice the previous driver accepted but never acted on (it crashed in between) is replayed
by the next driver and acted on once the first mesh is formed."""

from __future__ import annotations

from orchestrator.config import load_config
from orchestrator.events.intake import EventIntake
from tests.controller.fakes import FakeClock, FakeCluster
from tests.controller.harness import BASE, make


def test_unhandled_notice_of_a_crashed_driver_is_replayed(tmp_path):
    cfg = load_config(None, BASE)
    cluster = FakeCluster(slices=("s0", "s1"))
    clock = FakeClock()
    deadline = clock.now() + 3600
    crashed = EventIntake(cfg.events, run_dir=tmp_path / "run", job="default", clock=clock.now)
    crashed.start()
    crashed.submit({"schema_version": 1, "kind": "preemption_notice", "id": "before-crash",
                    "target": {"job": "default", "host": "vm-s0-0"}, "deadline": deadline,
                    "source": "test"}, source="test")
    accepted = crashed.poll(cluster.hosts(), 1)
    assert [e.id for e in accepted] == ["before-crash"]
    crashed.close()  # the driver dies here: accepted and acked, never acted on

    sim = make(tmp_path, spare=("s1",))  # the next driver, on the same run directory

    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    actions = [e for e in sim.events() if e.get("event_id") == "before-crash"
               or e.get("event", {}).get("id") == "before-crash"]
    assert any(a.get("action") == "drain_now" for a in actions), actions
    assert {h.slice_name for h in sim.fleet.groups[-1].spec.plan.hosts} == {"s1"}
