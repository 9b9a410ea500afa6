"""Elastic shrink/grow and a node removed without notice, on a cluster of 1-host slices.

The module's cluster changes as it goes (a slice is added, a node removed), so it is not shared
with other modules. Slices hold one host of 2 devices, which keeps every group small.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from orchestrator.controller.config import ChaosFaultConfig
from orchestrator.raygroup.cluster_view import RayClusterView
from orchestrator.shared import layout as ckpt_layout
from tests.faults.harness import (
    Action,
    alive_host_processes,
    fault_config,
    print_recovery,
    run_controller,
    started_cluster,
)
from tests.support.ray_cluster import RunningCluster

pytestmark = pytest.mark.cluster

@pytest.fixture(scope="module")
def cluster() -> Iterator[RunningCluster]:
    with started_cluster(slices=2, hosts_per_slice=1, devices_per_host=2) as running:
        yield running

TWO_SLICES = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1",
              "cluster.emulate.devices_per_host=2")


def _running_slices(result) -> list[tuple[str, ...]]:
    """The slices of each incarnation, in order (from the RUNNING transitions)."""
    out: list[tuple[str, ...]] = []
    for t in result.timeline:
        if t["state"] == "RUNNING" and (not out or tuple(t["slices"]) != out[-1]):
            out.append(tuple(t["slices"]))
    return out


@pytest.mark.parametrize("doomed", [1, 0])
def test_announced_shrink_loads_the_step_compiled_ahead(cluster, tmp_path, doomed):
    """Runs first: the module's next test adds a slice, which a notice would move onto.
    While 2 slices train, slice 0's process compiles the 1-slice step at nice 19 and stores
    it (``compile.ahead``); the shrink after a notice for slice 1 then loads it instead of
    compiling inside its downtime; also when slice 0, whose process compiled it, is the one
    that goes (the survivor is process 0 of the new runtime, with the same device ids). The
    notice comes 2 steps after the first step, before the compile ahead can be done: leaving
    the group waits for it (it is the step the next group needs)."""
    chaos = [ChaosFaultConfig(at_step=2, host=doomed, kind="preempt", deadline_s=60)]
    store = tmp_path / "executables"  # its own: the suite's shared store may hold these keys
    cfg = fault_config(tmp_path / "run", *TWO_SLICES, "run.total_steps=8", f"compile.dir={store}",
                       "controller.elastic.shrink_after_s=0", chaos=chaos)
    result = run_controller(cfg)
    print_recovery("shrink-ahead", result)

    s = result.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 8, 0)
    assert [len(x) for x in _running_slices(result)] == [2, 1]
    assert [c["source"] for c in s.compiles] == ["compiled", "loaded"], s.compiles
    assert s.forms[1]["processes"]["parked"] == 1, "the survivor's process was kept"
    assert list(store.glob("train_step.*.p0-of-1.xla"))


def test_notice_for_one_slice_shrinks_then_grows_back_on_a_new_slice(cluster, tmp_path):
    """Slice 1 preempted, no spare: continue on 1 slice, grow to 2 when a new slice joins."""
    chaos = [ChaosFaultConfig(at_step=6, host=1, kind="preempt", deadline_s=60)]
    added: list[str] = []

    def add_slice(ctl) -> None:
        # Return once the driver's view of the cluster has the slice: a node's resources can
        # reach ray.nodes() after Ray calls it alive, and a fast run could end before that.
        added.append(cluster.emulated.add_slice(1))
        deadline = time.monotonic() + 60
        while added[0] not in {h.slice_name for h in RayClusterView().hosts()}:
            assert time.monotonic() < deadline, f"{added[0]} never reached the driver's view"
            time.sleep(0.1)

    grow = Action(step=8, name="add_slice", fn=add_slice)
    # 80 steps: one slice runs them in ~40 ms each, and the grow waits for a save made after
    # the slice joined to commit (async, ~0.5-1 s here); at 40 steps a loaded machine finished
    # the run before that commit and never grew.
    cfg = fault_config(tmp_path / "run", *TWO_SLICES, "run.total_steps=80",
                       "controller.elastic.shrink_after_s=0", chaos=chaos)
    result = run_controller(cfg, actions=[grow])
    print_recovery("elastic", result)

    s = result.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 80, 0)
    first, shrunk, grown = _running_slices(result)
    assert len(first) == 2 and len(shrunk) == 1 and len(grown) == 2
    assert shrunk[0] in first and added[0] in grown and first[1] not in grown
    restored = [r["restored_step"] for r in result.restores]
    assert restored[0] is None and restored[1] == 6 and restored[2] % 5 == 0
    assert restored[2] >= 10, "the grow waits for the next checkpoint after the slice joined"
    # both drains kept slice 0's process and re-initialised it in process (controller.warm
    # .reuse_processes=auto is on for CPU); the new slice's host got a fresh one
    assert [f["processes"] for f in s.forms] == [
        {"fresh": 2, "parked": 0, "standby": 0}, {"fresh": 0, "parked": 1, "standby": 0},
        {"fresh": 1, "parked": 1, "standby": 0}]
    assert len(set(result.host_pids)) == 3, f"pids {result.host_pids}: slice 0's is reused"


def test_node_removed_without_notice_restores_last_checkpoint(cluster, tmp_path):
    """A node disappears mid-run: host_lost, restore the newest committed checkpoint."""
    removed: list[str] = []

    def remove_host_1(ctl) -> None:
        # The step-5 save is async: on a loaded machine it may still be in flight two steps
        # later, and a save that never committed is (rightly) not restored. Remove the node
        # once step 5 is committed, so the test says what it means: restore the last commit.
        deadline = time.monotonic() + 120
        while not ckpt_layout.is_committed(tmp_path / "run" / "checkpoints", 5):
            assert time.monotonic() < deadline, "checkpoint 5 never committed"
            time.sleep(0.05)
        host = ctl.plan.hosts[1]
        removed.append(host.node_id)
        cluster.emulated.remove_host(host.slice_name, host.worker_id)

    cfg = fault_config(tmp_path / "run", *TWO_SLICES, "run.steps_per_call=1")
    result = run_controller(cfg, actions=[Action(step=7, name="remove_host", fn=remove_host_1)])
    print_recovery("node-loss", result)

    s = result.summary
    assert (s.state, s.step) == ("SUCCEEDED", 20)
    assert s.restarts == {"host_lost": 1}
    restored = [r["restored_step"] for r in result.restores]
    # the newest committed step when the node went: 5 here. Never an exact pin: a driver that
    # dispatches the next call before the action returns may see one more interval committed.
    assert restored[0] is None and restored[1] >= 5 and restored[1] % 5 == 0, restored
    # lost = reached - restored: within one interval, plus one more if the node went while
    # the next save was in flight (that save never commits, and is never restored)
    assert 1 <= s.lost_steps <= 10
    assert s.lost_steps == result.restores[1]["lost_steps"]
    assert removed[0] not in {h.node_id for h in result.controller.plan.hosts}
    assert alive_host_processes(result.host_pids) == []
