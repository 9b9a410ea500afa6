"""Controller details the fault tests rely on, without a cluster: chunk ends and save interval."""

from __future__ import annotations

import math

from orchestrator.config import load_config
from orchestrator.controller import RunController
from orchestrator.hosts import HostRef


class _NoCluster:
    def hosts(self) -> list[HostRef]:
        return []

    def platform(self) -> str:
        return "cpu"


def _controller(tmp_path, *overrides: str) -> RunController:
    cfg = load_config(None, [f"run.run_dir={tmp_path}", "cluster.mode=emulate", *overrides])
    return RunController(cfg, cfg.controller, run_dir=tmp_path, cluster=_NoCluster(),
                         clock=lambda: 1000.0)


def test_chunks_end_on_save_steps_and_chaos_steps(tmp_path):
    """A chunk never crosses a save step (grow needs a committed boundary) or a chaos step."""
    ctl = _controller(tmp_path, "run.steps_per_call=7", "run.total_steps=40",
                      "controller.checkpoint_interval.every_steps=5",
                      "controller.chaos=[{at_step: 13, host: 0, kind: preempt}]")
    ends = []
    step = 0
    while step < 40:
        step = ctl._chunk_end(5)
        ctl.progress.step = step
        ends.append(step)
    assert ends == [5, 10, 13, 15, 20, 25, 30, 35, 40]


def test_fixed_interval_is_the_configured_one(tmp_path):
    ctl = _controller(tmp_path, "controller.checkpoint_interval.every_steps=7")
    assert ctl.cfg_interval() == 7


def test_young_daly_interval_follows_measured_costs_and_restarts(tmp_path):
    """sqrt(2 · save cost · MTBI) / step time, with the restarts seen so far in the MTBI."""
    ctl = _controller(tmp_path, "controller.checkpoint_interval.kind=young_daly",
                      "controller.checkpoint_interval.every_steps=50",
                      "controller.checkpoint_interval.min_steps=10",
                      "controller.checkpoint_interval.max_steps=1000",
                      "controller.checkpoint_interval.prior_mtbi_s=3600")
    assert ctl.cfg_interval() == 50, "before anything is measured: every_steps"
    ctl.progress.step_times = [0.5] * 10
    ctl.progress.save_costs = [2.0] * 3
    assert ctl.cfg_interval() == round(math.sqrt(2 * 2.0 * 3600) / 0.5)
