"""Drains with the RAM tier: a copy to RAM only where it outlives the notice (controller with
the fake seam)."""

from __future__ import annotations

from tests.controller.harness import Sim, make


def notice_at_7(sim: Sim, deadline_in: float, *, copy_s: float = 0.01) -> None:
    """Copies measured at ``copy_s`` by step 6, a notice for vm-s0-0 (slice s0) at step 7."""
    sim.fleet.copy_s = copy_s
    sim.fleet.on_step(6, lambda g: sim.controller.run_state.ledger.copy_costs.extend(
        [copy_s] * 3))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0", deadline_in=deadline_in))


def drain_saves(sim: Sim) -> list[str]:
    return [p.purpose for p in sim.payloads("CHECKPOINTING") if p.purpose != "final"]


def test_short_notice_with_the_ram_tier_copies_to_ram_and_loses_nothing(tmp_path):
    """A 0.5 s notice at step 7: too short for a durable save, long enough to copy the step to
    RAM (measured 0.01 s): the drain copies it (slice s0's hosts' peers are in s1, which the
    notice spares), says there is no durable copy of it, and the next group restores it from
    RAM."""
    sim = make(tmp_path, "checkpoint.ram.enabled=true", "cluster.emulate.slices=2",
               slices=("s0", "s1"), spare=("s2",))
    notice_at_7(sim, 0.5)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert drain_saves(sim) == ["drain-ram-only"]
    copied = sim.fleet.ram_copies
    assert len(copied) == 1 and copied[0] >= 7
    assert summary.restores[1]["restored_step"] == copied[0]
    assert summary.restores[1]["tier"] == "ram"
    assert summary.lost_steps == 0
    reasons = [t.reason for t in sim.controller.lifecycle.timeline
               if t.state.value in ("CHECKPOINTING", "RELEASING")]
    assert any("RAM only" in r and "no durable copy" in r for r in reasons), reasons


def test_short_notice_without_the_ram_tier_still_falls_back(tmp_path):
    sim = make(tmp_path, spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0", deadline_in=0.5))
    summary = sim.run()
    assert summary.state == "SUCCEEDED" and sim.fleet.ram_copies == []
    assert summary.restores[1]["restored_step"] == 5 and summary.lost_steps >= 2


def test_a_notice_that_dooms_every_holder_of_a_copy_saves_durably(tmp_path):
    """One slice and no standby: each host's peer holder is on the same slice, so a notice for
    the slice dooms both holders of every copy; a copy to RAM would go down with them, so the
    drain saves durably (the deadline allows it) and the next group restores that."""
    sim = make(tmp_path, "checkpoint.ram.enabled=true", "controller.warm.standby_slices=0",
               "controller.warm.handover_max_s=0", spare=("s1",))
    notice_at_7(sim, 30)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert drain_saves(sim) == ["drain"]
    assert sim.fleet.ram_copies == []
    assert summary.restores[1]["tier"] == "durable" and summary.lost_steps == 0


def test_one_slice_with_a_standby_hands_over_in_ram_on_the_spare(tmp_path):
    """One slice with a standby on the spare (the default): the peer copies are on the spare
    slice, which the notice spares, so the drain hands over in RAM and the next group, formed
    on the spare, restores from there."""
    sim = make(tmp_path, "checkpoint.ram.enabled=true", spare=("s1",))
    notice_at_7(sim, 30)
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    assert drain_saves(sim) == ["drain-ram-then-durable"]
    assert summary.restores[1]["tier"] == "ram" and summary.lost_steps == 0
