"""The simulator against cases computable by hand (no timing assertions: virtual time only)."""

from __future__ import annotations

import pytest

from orchestrator.sim.processes import Happening
from orchestrator.sim.runner import simulate
from tests.sim.helpers import COMPILE, FORM, RESTORE, STARTUP, tiny


def test_no_failures_goodput_is_one_minus_the_checkpoint_cost(tmp_path):
    # 100 steps of 1 s, a 0.5 s blocking save every 10 steps (10 saves), then the final save
    # (step 100 is already committed: nothing more to write) and SUCCEEDED.
    r = simulate(tiny("total_steps=100", "checkpoint.tiers.gcs.blocking_s=0.5"),
                 run_dir=tmp_path)
    assert r.state == "SUCCEEDED"
    assert r.steps == 100 and r.lost_steps == 0
    assert r.time_in_state_s["RUNNING"] == pytest.approx(100 + 10 * 0.5)
    assert r.badput_s["checkpoint"] == pytest.approx(5.0)
    assert r.simulated_s == pytest.approx(STARTUP + 105.0)
    assert r.goodput == pytest.approx(100.0 / (STARTUP + 105.0))
    running_goodput = r.productive_s / r.time_in_state_s["RUNNING"]
    assert running_goodput == pytest.approx(1.0 - 0.5 / (10 * 1.0 + 0.5))


def test_no_failures_until_the_horizon(tmp_path):
    r = simulate(tiny("checkpoint.tiers.gcs.blocking_s=0.5", "horizon_h=0.5"), run_dir=tmp_path)
    horizon = 1800.0
    cycles = (horizon - STARTUP) // 10.5  # full (10 steps + a save) cycles
    assert r.state == "RUNNING" and r.reason == "simulation horizon reached"
    assert r.simulated_s == pytest.approx(horizon)
    assert r.badput_s["checkpoint"] == pytest.approx(0.5 * cycles)
    assert r.goodput == pytest.approx((horizon - STARTUP - 0.5 * cycles) / horizon)


def test_one_failure_loses_exactly_the_steps_since_the_last_commit(tmp_path):
    # the host dies 25.5 s into training: 25 steps done, step 20 committed -> 5 steps lost
    dies = STARTUP + 25.5
    r = simulate(tiny("horizon_h=0.1"), run_dir=tmp_path,
                 extra=[Happening(t=dies, kind="host_failure", slice_index=0, worker=1)])
    assert r.lost_steps == 5
    assert r.badput_s["lost_steps"] == pytest.approx(5.0)
    # the recovery opens when the peers notice (1 s after the death): backoff + re-form
    assert r.recoveries == {"unannounced:host_lost": {
        "count": 1, "mean_to_running_s": pytest.approx(2.0 + FORM + RESTORE + COMPILE),
        "further_failures": 0, "lost_steps": 5}}
    assert r.time_in_state_s["BACKOFF"] == pytest.approx(2.0)
    # after the death: 1 s until the peers notice (still RUNNING), 2 s backoff, a re-form
    reform = FORM + RESTORE + COMPILE
    assert r.time_in_state_s["RUNNING"] == pytest.approx(360.0 - STARTUP - 2.0 - reform)
    assert r.productive_s == pytest.approx(360.0 - STARTUP - 2.0 - reform - 5.0)


def test_an_announced_preemption_with_time_to_save_loses_nothing(tmp_path):
    r = simulate(tiny("horizon_h=0.1", "topology.spare_slices=1"), run_dir=tmp_path,
                 extra=[Happening(t=STARTUP + 25.5, kind="preemption", slice_index=0,
                                  lead_s=30.0, back_s=600.0)])
    assert r.lost_steps == 0
    # noticed 25.5 s in: the hosts stop two steps past the furthest (step 27, 1.5 s later),
    # the save of step 27 costs nothing here, then a re-form on the spare slice
    rec = r.recoveries["announced:spot_preemption"]
    assert rec["count"] == 1
    assert rec["mean_to_running_s"] == pytest.approx(1.5 + FORM + RESTORE + COMPILE)
    assert r.happenings["preemption_notice"] == 1 and r.happenings["preempted"] == 1
    assert "lost_steps" not in r.badput_s


def test_without_capacity_the_run_waits_then_fails_with_the_setting_to_change(tmp_path):
    r = simulate(tiny("horizon_h=0.5", "controller.max_wait_for_capacity_s=60",
                      "controller.elastic.enabled=false", "capacity.host_repair.mean_s=3600"),
                 run_dir=tmp_path,
                 extra=[Happening(t=STARTUP + 5.0, kind="host_failure", slice_index=0,
                                  worker=0, back_s=3600.0)])
    assert r.state == "FAILED"
    assert "max_wait_for_capacity_s" in r.reason
    assert r.badput_s["waiting_for_capacity"] == pytest.approx(60.0)


def test_a_flapping_host_is_cordoned_and_replaced_by_the_health_policy(tmp_path):
    # three unhealthy reports 30 s apart about slice 0's host 1: cordon_after=3 -> drain, re-form
    # on the spare slice; the cordoned host is never placed on again
    r = simulate(tiny("horizon_h=0.2", "topology.spare_slices=1",
                      "failures.unhealthy_reports=3"), run_dir=tmp_path,
                 extra=[Happening(t=STARTUP + 20.5 + 30.0 * i, kind="notice",
                                  event_kind="host_unhealthy", slice_index=0, worker=1)
                        for i in range(3)])
    assert r.happenings["host_unhealthy"] == 3
    assert r.recoveries["announced:hardware_health"]["count"] == 1
    assert r.lost_steps == 0
