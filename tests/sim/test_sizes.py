"""Phase costs as functions of a host's share of the state (issue 48 item 5): the copy into host
memory and a drain's hand-over grow with ``checkpoint.state_gb`` / hosts when the tier has a
``copy_gbps``; without one the blocking stays the fixed ``blocking_s`` it always was."""

from __future__ import annotations

import pytest

from orchestrator.sim import models
from orchestrator.sim.processes import Happening
from orchestrator.sim.runner import simulate
from tests.sim.helpers import STARTUP, tiny


def test_the_copy_into_host_memory_grows_with_the_share_per_host():
    sized = ("checkpoint.tiers.gcs.blocking_s=0.5", "checkpoint.tiers.gcs.copy_gbps=64")
    cfg = tiny("checkpoint.state_gb=64", *sized)
    # 64 GB over 2 hosts = 32 GB each, copied at 64 Gbit/s (8 GB/s) after 0.5 s
    assert models.save_blocking_s(cfg, 2) == pytest.approx(0.5 + 32 * 8 / 64)
    assert models.save_blocking_s(cfg, 4) == pytest.approx(0.5 + 16 * 8 / 64)
    bigger = tiny("checkpoint.state_gb=128", *sized)
    assert models.save_blocking_s(bigger, 2) == pytest.approx(0.5 + 64 * 8 / 64)


def test_without_a_copy_rate_the_blocking_stays_fixed_whatever_the_size():
    for state_gb in (0, 64, 8000):
        cfg = tiny(f"checkpoint.state_gb={state_gb}", "checkpoint.tiers.gcs.blocking_s=0.5")
        assert cfg.checkpoint.model.copy_gbps is None
        assert models.save_blocking_s(cfg, 2) == 0.5
        assert models.drain_save_s(cfg, 2) == pytest.approx(
            0.5 + models.save_commit_s(cfg, 2))
        explicit = tiny(f"checkpoint.state_gb={state_gb}", "checkpoint.tiers.gcs.blocking_s=0.5",
                        "checkpoint.tiers.gcs.copy_gbps=null")
        assert explicit == cfg


def test_a_run_without_a_copy_rate_is_the_run_it_was(tmp_path):
    # the closed-form run of test_closed_form, with copy_gbps given as null: the same numbers
    r = simulate(tiny("total_steps=100", "checkpoint.tiers.gcs.blocking_s=0.5",
                      "checkpoint.state_gb=16", "checkpoint.tiers.gcs.copy_gbps=null"),
                 run_dir=tmp_path)
    assert r.state == "SUCCEEDED" and r.steps == 100
    assert r.time_in_state_s["RUNNING"] == pytest.approx(100 + 10 * 0.5)
    assert r.model["save_blocking_s"] == 0.5


def test_every_save_of_a_run_blocks_for_the_sized_copy(tmp_path):
    # 2 GB over 2 hosts: 1 GB each, 0.1 s + 8 Gbit / 16 Gbit/s = 0.6 s per save, 10 saves
    r = simulate(tiny("total_steps=100", "checkpoint.state_gb=2",
                      "checkpoint.tiers.gcs.blocking_s=0.1", "checkpoint.tiers.gcs.copy_gbps=16"),
                 run_dir=tmp_path)
    assert r.state == "SUCCEEDED" and r.steps == 100
    assert r.model["save_blocking_s"] == pytest.approx(0.6)
    assert r.time_in_state_s["RUNNING"] == pytest.approx(100 + 10 * 0.6)


@pytest.mark.parametrize("state_gb", [4, 8])
def test_a_drains_hand_over_takes_the_copy_and_the_commit_of_the_share(tmp_path, state_gb):
    ram = ("checkpoint.tier=ram", "checkpoint.tiers.ram.blocking_s=0.05",
           "checkpoint.tiers.ram.copy_gbps=32", "checkpoint.tiers.ram.write_gbps=16",
           "checkpoint.tiers.ram.latency_s=0.1")
    cfg = tiny("horizon_h=0.1", "topology.spare_slices=1", f"checkpoint.state_gb={state_gb}",
               *ram)
    r = simulate(cfg, run_dir=tmp_path,
                 extra=[Happening(t=STARTUP + 25.5, kind="preemption", slice_index=0,
                                  lead_s=60.0, back_s=600.0)])
    share = state_gb / 2
    hand_over = 0.05 + share * 8 / 32 + 0.1 + share * 8 / 16
    assert models.drain_save_s(cfg, 2) == pytest.approx(hand_over)
    assert r.lost_steps == 0
    assert r.time_in_state_s["CHECKPOINTING"] == pytest.approx(hand_over)
