"""A group without the optional capabilities (the simulator's, ``PlainGroup`` here) gets the
paths the controller takes when a capability declines: no handover, durable saves only, no
compile-ahead, chaos notices but no injected faults, and the run succeeds."""

from __future__ import annotations

from structlog.testing import capture_logs

from orchestrator.controller.seam import CAPABILITIES
from tests.controller.fakes import PlainGroup
from tests.controller.harness import make


def _plain(sim):
    sim.fleet.group_cls = PlainGroup
    return sim


def test_plain_group_has_none_of_the_capabilities(tmp_path):
    sim = _plain(make(tmp_path))
    sim.run()
    assert not any(isinstance(sim.fleet.groups[0], cap) for cap in CAPABILITIES)


def test_a_notice_with_time_drains_at_once_without_warm_processes(tmp_path):
    sim = _plain(make(tmp_path, "cluster.emulate.slices=2", slices=("s0", "s1"),
                      spare=("s2",)))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s1-0"))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and summary.lost_steps == 0
    assert "HANDING_OVER" not in sim.states() and sim.fleet.warmed == []


def test_the_ram_tier_setting_without_a_ram_capable_group_saves_durably(tmp_path):
    """``checkpoint.ram.enabled`` with a group that has no RAM tier: a notice with time saves
    from the devices, a short one falls back to the last checkpoint; nothing is copied."""
    sim = _plain(make(tmp_path, "checkpoint.ram.enabled=true", spare=("s1", "s2")))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0"))
    sim.fleet.on_step(13, lambda g: sim.notice(host="vm-s1-0", deadline_in=0.1))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and sim.fleet.ram_copies == []
    purposes = [p.purpose for p in sim.payloads("CHECKPOINTING") if p is not None]
    assert purposes == ["drain", "final"]
    assert summary.lost_steps > 0  # the short notice fell back: no RAM copy to keep its steps


def test_no_compile_ahead_without_the_capability(tmp_path):
    sim = _plain(make(tmp_path, "cluster.emulate.slices=2", "run.total_steps=30",
                      slices=("s0", "s1")))
    assert sim.run().state == "SUCCEEDED"
    assert sim.fleet.ahead == []


def test_chaos_sends_notices_but_cannot_inject_faults(tmp_path):
    sim = _plain(make(tmp_path, "controller.chaos=[{at_step: 7, host: 1, kind: kill}, "
                      "{at_step: 9, host: 0, kind: preempt}]", spare=("s1",)))
    with capture_logs() as logs:
        summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert all(g.injected == [] for g in sim.fleet.groups)
    assert [e["kind"] for e in logs if e["event"] == "chaos_unsupported"] == ["kill"]
    assert any(e["event"] == "chaos_notice" for e in logs)


def test_no_hot_swap_onto_a_standby_the_group_cannot_keep(tmp_path):
    """``standby_slices: auto`` with a group that keeps no standby: a host failure backs off and
    re-forms as before (no hot spare is claimed), and no group is told of standby hosts."""
    from tests.controller.fakes import lost

    sim = _plain(make(tmp_path, spare=("s1",)))
    sim.fleet.on_step(7, lambda g: lost(hosts=(1,)))
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert "BACKOFF" in sim.states()
    assert not any("hot_swap" in str(e) for e in sim.events())
