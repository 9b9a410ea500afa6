"""Chunk ends and the save interval: the driver chooses where chunks end and where hosts save."""

from __future__ import annotations

import math

import pytest

from orchestrator.controller.running import chunk_end, save_interval
from policies.causes import StopCause
from policies.restart_budget import RestartRecord
from tests.controller.fakes import lost
from tests.controller.harness import make


def test_chunks_end_on_save_steps_and_chaos_steps(tmp_path):
    """A chunk never crosses a save step (grow needs a committed boundary) or a chaos step."""
    sim = make(tmp_path, "run.steps_per_call=7", "run.total_steps=40",
               "controller.checkpoint_interval.every_steps=5",
               "controller.chaos=[{at_step: 13, host: 0, kind: preempt}]")
    run = sim.controller.run_state
    ends = []
    while run.ledger.step < 40:
        run.ledger.step = chunk_end(run, 5)
        ends.append(run.ledger.step)
    assert ends == [5, 10, 13, 15, 20, 25, 30, 35, 40]


def test_a_drain_at_a_chosen_step_ends_the_chunk_there(tmp_path):
    from orchestrator.controller.context import Pending
    from policies.causes import StopCause

    sim = make(tmp_path, "run.steps_per_call=10", "controller.checkpoint_interval.every_steps=10")
    run = sim.controller.run_state
    run.pending = Pending(cause=StopCause.MAINTENANCE, reason="window", at_step=4)
    assert chunk_end(run, 10) == 4


def test_hosts_save_exactly_at_the_steps_the_driver_chose(tmp_path):
    sim = make(tmp_path, "run.total_steps=12", "run.steps_per_call=4",
               "controller.checkpoint_interval.every_steps=3")
    sim.run()
    chunks = sim.fleet.groups[0].chunks
    assert [c["save_steps"] for c in chunks] == [[3], [6], [9], [12]]


def test_fixed_interval_is_the_configured_one(tmp_path):
    sim = make(tmp_path, "controller.checkpoint_interval.every_steps=7")
    assert save_interval(sim.controller.run_state) == 7


def test_young_daly_interval_follows_measured_costs_and_restarts(tmp_path):
    """sqrt(2 · save cost · MTBI) / step time, with the unannounced restarts seen so far in the
    MTBI (an announced one, drained with a save, lost no work)."""
    sim = make(tmp_path, "controller.checkpoint_interval.kind=young_daly",
               "controller.checkpoint_interval.every_steps=50",
               "controller.checkpoint_interval.min_steps=10",
               "controller.checkpoint_interval.max_steps=1000",
               "controller.checkpoint_interval.prior_mtbi_s=3600")
    run = sim.controller.run_state
    assert save_interval(run) == 50, "before anything is measured: every_steps"
    run.ledger.step_times = [0.5] * 10
    run.ledger.save_costs = [2.0] * 3
    assert save_interval(run) == round(math.sqrt(2 * 2.0 * 3600) / 0.5)
    # an announced restart was drained with a save: it lost nothing, the interval stays
    before = save_interval(run)
    run.ledger.restarts.append(RestartRecord(cause=StopCause.SPOT_PREEMPTION, at=1.0,
                                             announced=True))
    assert save_interval(run) == before
    # an unannounced one lost work since the last save: the MTBI halves (prior weight 1)
    run.ledger.restarts.append(RestartRecord(cause=StopCause.HOST_LOST, at=2.0))
    observed = sim.clock.now() - run.started_at
    assert save_interval(run) == round(math.sqrt(2 * 2.0 * (3600 + observed) / 2) / 0.5) < before


@pytest.mark.parametrize(("deadline_in", "announced"), [(60.0, True), (0.05, False)])
def test_a_notice_counts_as_lossless_only_when_its_drain_saved(tmp_path, deadline_in,
                                                              announced):
    """Young/Daly's interruptions: a drained notice whose step was saved lost no work; one
    whose deadline was too short fell back to the last checkpoint, like a failure."""
    sim = make(tmp_path, "controller.deadline.on_short_deadline=fallback", spare=("s1",))
    sim.fleet.on_step(7, lambda g: sim.notice(host="vm-s0-0", deadline_in=deadline_in))
    assert sim.run().state == "SUCCEEDED"
    (restart,) = sim.controller.run_state.ledger.restarts
    assert restart.announced is announced
    assert (sim.controller.run_state.ledger.restores[-1]["lost_steps"] == 0) is announced


def test_a_failure_is_never_counted_lossless(tmp_path):
    sim = make(tmp_path, "controller.backoff.base_s=0")
    sim.fleet.on_step(3, lambda g: lost())
    assert sim.run().state == "SUCCEEDED"
    assert [r.announced for r in sim.controller.run_state.ledger.restarts] == [False]


def test_ram_every_auto_follows_the_measured_copy_cost(tmp_path):
    """``checkpoint.ram.every: auto``: the chunks carry the copy interval the driver chose from
    the copy and step times (6 % of a step per copy: every 4 steps keeps it within 2 %); the
    choice and its reason reach summary.json."""
    sim = make(tmp_path, "checkpoint.ram.enabled=true", "run.total_steps=60",
               "run.steps_per_call=5")
    sim.fleet.pack_s = 0.006
    summary = sim.run()
    assert summary.state == "SUCCEEDED"
    every = [c["copy_every"] for c in sim.fleet.groups[0].chunks]
    assert every[0] == 1 and every[-1] == 4 and set(every) == {1, 4}
    chosen = summary.protection["ram_every"]
    assert chosen[0]["every"] == 1 and "not measured" in chosen[0]["reason"]
    assert chosen[-1]["every"] == 4 and chosen[-1]["overhead"] == pytest.approx(0.015)
    assert "every 2 would cost 3.00%" in chosen[-1]["reason"]


def test_a_fixed_ram_interval_or_no_tier_passes_none(tmp_path):
    for i, setting in enumerate(("checkpoint.ram.every=3", "checkpoint.ram.enabled=false")):
        sim = make(tmp_path / str(i), "checkpoint.ram.enabled=true", setting)
        assert sim.run().state == "SUCCEEDED"
        assert {c["copy_every"] for c in sim.fleet.groups[0].chunks} == {None}
        assert "ram_every" not in sim.run_dir.joinpath("summary.json").read_text()


def test_ram_every_auto_weighs_copies_after_a_groups_start_and_the_newest_five():
    """A group's first four copies measure its start (first touches, compile, pre-form): left
    out; the interval weighs the five newest, so the start's slow copies do not stretch it."""
    from orchestrator.controller.ledger import PACK_WARMUP, RecoveryLedger

    led = RecoveryLedger()
    led.incarnation = 1
    start = [2.7, 0.77, 0.24, 0.22]
    steady = [0.5, 0.5, 0.04, 0.03, 0.05, 0.03, 0.04]
    recs = tuple({"step": i + 1, "loss": 1.0, "step_time_s": 1.0, "ram_copy_s": c}
                 for i, c in enumerate(start + steady))
    led.absorb(len(recs), None, recs)
    assert len(start) == PACK_WARMUP and led.pack_costs == steady
    assert led.median_pack_s(5) == pytest.approx(0.04)
    led.incarnation = 2  # a new group starts its own warm-up
    led.absorb(len(recs) + 1, None, ({"step": len(recs) + 1, "loss": 1.0, "step_time_s": 1.0,
                                      "ram_copy_s": 3.0},))
    assert led.pack_costs == steady


def test_ram_every_auto_weighs_the_pack_apart_from_the_wait_for_the_previous_copy():
    """A step's copy seconds are its pack plus its wait for the copy before it to be delivered
    (``ram_wait_s``): the ledger keeps the pack as the copy's cost and the delivery time (the
    wait plus the steps between the copies) apart, so a wait seen while copying every step does
    not price every interval."""
    from orchestrator.controller.ledger import PACK_WARMUP, RecoveryLedger

    led = RecoveryLedger()
    led.incarnation = 1
    recs = tuple({"step": i + 1, "loss": 1.0, "step_time_s": 2.85, "ram_copy_s": 0.55,
                  "ram_wait_s": 0.35} for i in range(PACK_WARMUP + 5))
    led.absorb(len(recs), None, recs)
    assert led.median_pack_s(5) == pytest.approx(0.2)
    assert led.median_deliver_s(5) == pytest.approx(0.35 + 2.85)
    led.copy_every = 4  # at a longer interval the copies wait for nothing: no new delivery
    led.absorb(len(recs) + 1, None, ({"step": len(recs) + 1, "loss": 1.0, "step_time_s": 2.85,
                                      "ram_copy_s": 0.2, "ram_wait_s": 0.0},))
    assert led.median_deliver_s(5) == pytest.approx(3.2) and len(led.deliver_costs) == 5
