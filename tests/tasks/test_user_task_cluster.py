"""A user's task (examples/my_task, Flax NNX) gets the guarantees the built-in LM gets, on a real
cluster (Ray, JAX, Orbax; three 1-host slices, the run on two, one spare): host 1 killed with -9
mid-run with the RAM tier on restores from RAM; a preemption notice drains onto a warm standby
(which resolved the user's module before it joined); both end with the parameters of an
uninterrupted run, bit for bit."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import RunConfig, load_config
from orchestrator.controller_config import ChaosFaultConfig
from tests.faults.harness import (
    BASE_OVERRIDES,
    RunResult,
    print_recovery,
    run_controller,
    started_cluster,
)
from tests.support.ray_cluster import RunningCluster

pytestmark = pytest.mark.cluster

TASK = ("task.kind=examples.my_task.task:make_task", "task.hidden=32")
TWO_SLICES = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1")


def user_config(run_dir: Path, *overrides: str, chaos=()) -> RunConfig:
    """The fault tests' small run (20 steps, save every 5) with the user's task."""
    base = [o for o in BASE_OVERRIDES if not o.startswith("model.")]  # model.* is lm's
    cfg = load_config(None, [f"run.run_dir={run_dir}", *base, *TASK, *TWO_SLICES, *overrides])
    if chaos:
        cfg = dataclasses.replace(cfg, controller=dataclasses.replace(cfg.controller,
                                                                      chaos=tuple(chaos)))
    return cfg


@pytest.fixture(scope="module")
def cluster() -> Iterator[RunningCluster]:
    with started_cluster(slices=3, hosts_per_slice=1, devices_per_host=2) as running:
        yield running


@pytest.fixture(scope="module")
def plain(cluster, tmp_path_factory) -> RunResult:
    """The uninterrupted run both tests compare with."""
    out = run_controller(user_config(tmp_path_factory.mktemp("plain")), collect_params=True)
    assert (out.summary.state, out.summary.step) == ("SUCCEEDED", 20)
    return out


def test_user_task_kill_9_restores_from_ram_and_ends_bit_identical(cluster, plain, tmp_path):
    chaos = [ChaosFaultConfig(at_step=7, host=1, kind="kill")]
    hit = run_controller(user_config(tmp_path / "hit", "checkpoint.ram.enabled=true",
                                     chaos=chaos), collect_params=True)
    print_recovery("user-task-ram-kill", hit)
    s = hit.summary
    assert (s.state, s.step) == ("SUCCEEDED", 20)
    assert s.restarts == {"host_lost": 1}
    again = hit.restores[1]
    assert again["tier"] == "ram" and again["restored_step"] in (6, 7), again
    assert s.lost_steps <= 1
    assert plain.final_params is not None and hit.final_params is not None
    assert sorted(plain.final_params) == sorted(hit.final_params)
    assert any(k.startswith("layers/") for k in plain.final_params), sorted(plain.final_params)
    for k, v in plain.final_params.items():
        np.testing.assert_array_equal(v, hit.final_params[k], err_msg=k)


def test_user_task_notice_drains_onto_a_warm_standby_and_ends_bit_identical(cluster, plain,
                                                                            tmp_path):
    chaos = [ChaosFaultConfig(at_step=8, host=1, kind="preempt", deadline_s=60)]
    hit = run_controller(user_config(tmp_path / "hit", "controller.warm.standby_slices=1",
                                     chaos=chaos), collect_params=True)
    print_recovery("user-task-standby", hit)
    s = hit.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 20, 0)
    assert s.restarts == {"spot_preemption": 1}
    assert "DRAINING" in hit.states
    assert [r["restored_step"] for r in hit.restores] == [None, 8]
    assert hit.summary.recoveries[0]["processes"]["standby"] == 1, hit.summary.recoveries
    assert plain.final_params is not None and hit.final_params is not None
    for k, v in plain.final_params.items():
        np.testing.assert_array_equal(v, hit.final_params[k], err_msg=k)
