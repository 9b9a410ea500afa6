"""The simulator's parts: world time, the disk's commit rule, models, sweep helpers, plots."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.sim import models
from orchestrator.sim.disk import Disk, Save
from orchestrator.sim.report import text_plot
from orchestrator.sim.sweeps import fit_optimum, mtbf_s, step_growth, young_daly_steps
from orchestrator.sim.world import HorizonReached, Probe, SimClock, World
from tests.sim.helpers import tiny


def test_the_world_runs_actions_in_time_order_and_stops_at_the_horizon():
    w = World(start=100.0, horizon_s=10.0)
    seen = []
    w.at(105.0, "b", lambda: seen.append(("b", w.t)))
    w.at(102.0, "a", lambda: seen.append(("a", w.t)))
    w.at(105.0, "c", lambda: seen.append(("c", w.t)))  # same time: insertion order
    w.at(120.0, "late", lambda: seen.append(("late", w.t)))
    clock = SimClock(w, Probe())
    clock.sleep(6.0)
    assert seen == [("a", 102.0), ("b", 105.0), ("c", 105.0)] and clock.now() == 106.0
    with pytest.raises(HorizonReached):
        clock.sleep(60.0)
    assert clock.now() == 110.0 and ("late", 120.0) not in seen


def test_a_save_counts_only_once_committed_and_never_if_its_hosts_die_first():
    d = Disk()
    d.pending += [Save(step=10, commit_at=5.0, nodes=frozenset({"a", "b"})),
                  Save(step=20, commit_at=9.0, nodes=frozenset({"a", "b"}))]
    assert d.newest(4.9) is None
    assert d.newest(5.0) == 10
    d.lost(frozenset({"b"}), at=8.0)  # before step 20 committed
    assert d.newest(100.0) == 10
    assert d.newest(100.0, skip={10}) is None


def test_step_time_adds_the_exposed_dcn_all_reduce():
    cfg = tiny("step.compute_s=2", "step.dcn_gb=1", "step.dcn_gbps=8", "step.overlap=0.5")
    assert models.step_s(cfg, 1) == 2.0
    # ring: 2*(n-1)/n * 1 GB * 8 / 8 Gbit/s = 1.5 s for 4 slices, half of it hidden
    assert models.step_s(cfg, 4) == pytest.approx(2.0 + 0.75)
    assert models.step_s(cfg, 4, accum_steps=2) == pytest.approx(4.0 + 0.75)


def test_checkpoint_costs_follow_the_tier_and_the_share_per_host():
    cfg = tiny("checkpoint.state_gb=64", "checkpoint.tier=local_ssd")
    # 64 GB over 2 hosts = 32 GB each; local_ssd writes 8 Gbit/s, reads 16, 0.2 s latency
    assert models.save_commit_s(cfg, 2) == pytest.approx(0.2 + 32 * 8 / 8)
    assert models.restore_s(cfg, 2) == pytest.approx(1.0 + 0.2 + 32 * 8 / 16)


@pytest.mark.parametrize("kind", ["fixed", "exponential", "lognormal", "uniform"])
def test_delays_have_the_configured_mean(kind):
    cfg = tiny(f"capacity.slice_return.kind={kind}", "capacity.slice_return.mean_s=100")
    rng = random.Random(1)
    draws = [models.draw_delay(cfg.capacity.slice_return, rng) for _ in range(20000)]
    assert min(draws) >= 0
    assert sum(draws) / len(draws) == pytest.approx(100.0, rel=0.03)


def test_young_daly_uses_the_unannounced_failure_rate_of_the_mesh():
    cfg = tiny("failures.host_per_hour=0.5", "failures.preemption_per_slice_hour=1",
               "failures.notice_missed_fraction=0.5", "checkpoint.tiers.gcs.blocking_s=8")
    assert mtbf_s(cfg) == pytest.approx(3600.0 / (0.5 * 2 + 1 * 0.5))
    assert young_daly_steps(cfg) == pytest.approx(math.sqrt(2 * 8 * 2400.0) / 1.0)


def test_dalys_optimum_is_youngs_less_the_save_cost_to_first_order():
    c, m = 30.0, 3600.0
    r = c / (2 * m)
    assert models.daly_s(c, m) == pytest.approx(
        math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c)
    assert models.daly_s(c, m) < models.young_daly_s(c, m)
    assert models.daly_s(100.0, 40.0) == 40.0  # C >= 2M: checkpoint every MTBF


def test_the_fit_finds_the_optimum_of_youngs_model():
    c, m = 30.0, 3600.0
    xs = [100, 200, 300, 465, 600, 900, 1500]
    ys = [1 - c / x - x / (2 * m) - 0.01 for x in xs]
    assert fit_optimum(xs, ys) == pytest.approx(math.sqrt(2 * c * m), rel=1e-6)
    assert fit_optimum(xs, [0.5 + 0.001 * x for x in xs]) is None  # no interior maximum


def test_step_growth_is_the_log_log_slope_per_step():
    rows = [{"hosts": 1024, "steps_p50_ms": {"a->b": 1.0, "c->d": 0.5, "tiny": 0.01}},
            {"hosts": 4096, "steps_p50_ms": {"a->b": 4.0, "c->d": 8.0, "tiny": 0.04}}]
    g = step_growth(rows)
    assert list(g) == ["c->d", "a->b"]  # worst first; under the floor left out
    assert g["a->b"]["slope"] == pytest.approx(1.0) and g["c->d"]["slope"] == pytest.approx(2.0)


def test_the_text_plot_marks_the_optimum_column():
    plot = text_plot([1, 10, 100], [0.2, 0.9, 0.4], mark_x=10, logx=True, width=21, height=5)
    rows = [r[3:] for r in plot.splitlines()[1:6]]
    assert rows[0][10] == "*" and all(r[10] in "|*" for r in rows)
    assert "'|' at 10" in plot
