"""The host-RAM checkpoint tier end to end, on a cluster of two 1-host slices (real Ray, JAX,
Orbax): a host killed with -9 costs at most one step and the run ends with the parameters of an
uninterrupted run; a node lost with its holder restores from the peer's copy into the smaller
mesh the run goes on with. Which tier, damaged copies and incomplete sets are decided by
``policies.ram_tier`` (tests/policies/test_ram_tier.py); packing and authentication on real JAX in
tests/workers/test_replica.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import numpy as np
import pytest

from orchestrator.controller.config import ChaosFaultConfig
from orchestrator.shared import layout as ckpt_layout
from tests.faults.harness import (
    Action,
    fault_config,
    print_recovery,
    run_controller,
    started_cluster,
)
from tests.support.ray_cluster import RunningCluster
from workers.ram import copy_store

pytestmark = pytest.mark.cluster

TWO_SLICES = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1",
              "cluster.emulate.devices_per_host=2")
RAM = ("checkpoint.ram.enabled=true", "checkpoint.ram.every=1")
"""The tier copying every step: what these tests hold it to (``every: auto`` is the controller's
choice, tests/controller/test_chunks.py)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[RunningCluster]:
    with started_cluster(slices=2, hosts_per_slice=1, devices_per_host=2) as running:
        yield running


def test_kill_9_loses_at_most_one_step_and_ends_with_uninterrupted_params(cluster, tmp_path):
    """Saves every 5 steps; host 1 killed before step 8. Orbax alone restores 5 (2 lost)."""
    plain = run_controller(fault_config(tmp_path / "plain", *TWO_SLICES), collect_params=True)
    assert (plain.summary.state, plain.summary.step) == ("SUCCEEDED", 20)

    chaos = [ChaosFaultConfig(at_step=7, host=1, kind="kill")]
    hit = run_controller(fault_config(tmp_path / "hit", *TWO_SLICES, *RAM, chaos=chaos),
                         collect_params=True)
    print_recovery("ram-kill", hit)

    s = hit.summary
    assert (s.state, s.step) == ("SUCCEEDED", 20)
    assert s.restarts == {"host_lost": 1}
    again = hit.restores[1]
    assert again["tier"] == "ram", again
    assert again["restored_step"] in (6, 7), "the newest complete set of copies"
    assert s.lost_steps <= 1
    assert s.last_committed_step == 20, "the durable tier still saves as configured"
    assert plain.final_params is not None and hit.final_params is not None
    for k, v in plain.final_params.items():
        np.testing.assert_array_equal(v, hit.final_params[k], err_msg=k)
    # both nodes hold copies (own + peer), bounded by keep=2 per sending host
    assert len(hit.ram_stats) == 2
    assert all(0 < v["copies"] <= 4 for v in hit.ram_stats.values()), hit.ram_stats


def test_saves_written_from_ram_copies_restore_bit_identically(cluster, tmp_path):
    """Saves every 5 steps are written by the holders from their RAM copies, not by the training
    processes (Orbax there saves only the final step). A later run on the same directory, its RAM
    copies gone and step 20 removed, restores the saved copy of step 15 and ends with the first
    run's parameters."""
    run = tmp_path / "run"
    first = run_controller(fault_config(run, *TWO_SLICES, *RAM), collect_params=True)
    assert (first.summary.state, first.summary.step) == ("SUCCEEDED", 20)
    copies = copy_store.copies_dir(run / "checkpoints")
    saved = copy_store.complete_steps(copies)
    assert saved[-2:] in ([10, 15], [15, 20]), saved
    assert ckpt_layout.committed_steps(run / "checkpoints") == [20], "only the final save"
    assert sum(v["persisted"] for v in first.ram_stats.values()) >= 2 * len(saved)
    for where in (run / "checkpoints" / "20", copies / "20"):
        shutil.rmtree(where, ignore_errors=True)

    second = run_controller(fault_config(run, *TWO_SLICES, *RAM), collect_params=True)
    assert (second.summary.state, second.summary.step) == ("SUCCEEDED", 20)
    restored = second.restores[0]
    assert (restored["tier"], restored["restored_step"]) == ("copy", 15), restored
    assert first.final_params is not None and second.final_params is not None
    for k, v in first.final_params.items():
        np.testing.assert_array_equal(v, second.final_params[k], err_msg=k)


def test_a_new_driver_restores_from_the_holders_the_old_one_left(cluster, tmp_path):
    """Autoresume's case: the driver is gone, its holders (detached) are not. A new driver on
    the same run directory (the run's secret read back from it: the holders answer it and the
    copies authenticate under it) with all durable steps removed restores the newest RAM copies
    and goes on."""
    run = tmp_path / "run"
    cfg = fault_config(run, *TWO_SLICES, *RAM, "controller.checkpoint_interval.every_steps=50")
    first = run_controller(cfg, release_ram=False)
    assert (first.summary.state, first.summary.step) == ("SUCCEEDED", 20)
    shutil.rmtree(run / "checkpoints")  # nothing durable left: only RAM can give step 20
    longer = fault_config(run, *TWO_SLICES, *RAM, "run.total_steps=24",
                          "controller.checkpoint_interval.every_steps=50")
    second = run_controller(longer)
    restored = second.restores[0]
    assert (restored["tier"], restored["restored_step"]) == ("ram", 20), restored
    assert (second.summary.state, second.summary.step) == ("SUCCEEDED", 24)


def test_notice_too_short_for_a_durable_save_copies_to_ram_and_loses_nothing(cluster,
                                                                             tmp_path):
    """A preemption notice for host 1 with 1.5 s left: a durable save is expected to need 3 s,
    a RAM copy a few ms. The drain copies the stopped step to RAM, the run shrinks to slice 0
    and restores that step from RAM: 0 steps lost, and the timeline says nothing durable was
    written for it."""
    chaos = [ChaosFaultConfig(at_step=8, host=1, kind="preempt", deadline_s=1.5)]
    cfg = fault_config(tmp_path / "run", *TWO_SLICES, *RAM, "controller.elastic.shrink_after_s=0",
                       chaos=chaos)
    result = run_controller(cfg)
    print_recovery("ram-short-notice", result)

    s = result.summary
    assert (s.state, s.step, s.lost_steps) == ("SUCCEEDED", 20, 0)
    again = result.restores[1]
    assert again["tier"] == "ram" and again["restored_step"] >= 8, again
    reasons = [t["reason"] for t in result.timeline if t["state"] == "CHECKPOINTING"]
    assert any("RAM only" in r for r in reasons), reasons


def test_node_lost_with_its_holder_restores_the_peer_copy_into_a_smaller_mesh(cluster,
                                                                              tmp_path):
    """Node 1 (host 1 and its holder) removed without notice at step >= 7: host 1's copy lives
    on in node 0's holder, so the run restores from RAM into the one-slice mesh it goes on
    with."""
    removed: list[str] = []

    def remove_host_1(ctl) -> None:
        host = ctl.plan.hosts[1]
        removed.append(host.node_id)
        cluster.emulated.remove_host(host.slice_name, host.worker_id)

    cfg = fault_config(tmp_path / "run", *TWO_SLICES, *RAM, "run.steps_per_call=1",
                       "controller.checkpoint_interval.every_steps=50")
    result = run_controller(cfg, actions=[Action(step=7, name="remove_host", fn=remove_host_1)])
    print_recovery("ram-node-loss", result)

    s = result.summary
    assert (s.state, s.step) == ("SUCCEEDED", 20)
    again = result.restores[1]
    assert again["tier"] == "ram", again
    assert again["restored_step"] >= 6, "no durable step exists: only RAM could give this"
    assert again["lost_steps"] <= 1
    slices = {tuple(t["slices"]) for t in result.timeline if t["state"] == "RUNNING"}
    assert len(max(slices, key=len)) == 2 and len(min(slices, key=len)) == 1, slices
    assert removed[0] not in {h.node_id for h in result.controller.plan.hosts}
