"""Same seed, same run; another seed, another schedule."""

from __future__ import annotations

import json

from orchestrator.sim.processes import generate
from orchestrator.sim.runner import simulate
from tests.sim.helpers import tiny

BUSY = ("horizon_h=6", "topology.slices=2", "topology.spare_slices=1",
        "failures.host_per_hour=0.2", "failures.preemption_per_slice_hour=0.2",
        "failures.slice_loss_per_hour=0.05", "capacity.host_repair.kind=exponential",
        "capacity.host_repair.mean_s=600", "controller.budgets.host_lost=1000",
        "controller.batch_on_resize=scale", "reform.jitter=0.2")


def _timeline(run_dir) -> list[tuple]:
    rows = [json.loads(x) for x in (run_dir / "timeline.jsonl").read_text().splitlines()]
    return [(r["state"], r["at"], r["step"], r["hosts"]) for r in rows]


def test_the_same_seed_gives_the_same_run(tmp_path):
    a = simulate(tiny(*BUSY), run_dir=tmp_path / "a")
    b = simulate(tiny(*BUSY), run_dir=tmp_path / "b")
    assert a.recoveries, "the schedule should make the run recover at least once"
    for key in ("goodput", "badput_s", "steps", "lost_steps", "recoveries", "happenings",
                "time_in_state_s", "state"):
        assert getattr(a, key) == getattr(b, key), key
    assert _timeline(tmp_path / "a") == _timeline(tmp_path / "b")


def test_another_seed_gives_another_schedule(tmp_path):
    a = simulate(tiny(*BUSY), run_dir=tmp_path / "a")
    c = simulate(tiny(*BUSY, "seed=7"), run_dir=tmp_path / "c")
    assert _timeline(tmp_path / "a") != _timeline(tmp_path / "c")
    assert a.goodput != c.goodput


def test_a_policy_change_keeps_the_failure_schedule():
    # common random numbers: each process has its own generator
    base = generate(tiny(*BUSY), 3)
    other = generate(tiny(*BUSY, "controller.checkpoint_interval.every_steps=40",
                          "failures.maintenance_per_slice_hour=0.5"), 3)
    assert [h for h in other if h.kind != "maintenance"] == base
    assert any(h.kind == "maintenance" for h in other)
