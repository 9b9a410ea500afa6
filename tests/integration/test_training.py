"""Multi-host GSPMD training on an emulated cluster: equality, re-mesh, multislice.

A resume onto a new group of the same shape is bit-identical: that is proven end to end,
through a real drain and re-form, by tests/faults/test_group_faults.py.

One cluster serves the module: slice ``pod`` (2 hosts) and slices ``ms-a``/``ms-b`` (1 host
each), every host with 2 CPU devices. Each run forms a real JAX group of Ray actors through
the host actor contract (``tests.integration.groups``) and checkpoints with Orbax into a
temporary run directory.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.shared.errors import CheckpointError
from tests.integration.cli import snapshot
from tests.integration.groups import (
    Group,
    References,
    max_abs_diff,
    train_group,
)
from tests.support.ray_cluster import cluster_fixture

pytestmark = pytest.mark.cluster

STEPS = 10
RESUME_AT = 4
OVERRIDES = [f"run.total_steps={STEPS}", "train.warmup_steps=2", "train.learning_rate=1e-2"]
TOL = 1e-6

MULTISLICE_MESH = ["mesh.ici.data=2", "mesh.ici.fsdp=2"]

cluster = cluster_fixture(layout=[2, 1, 1], names=["pod", "ms-a", "ms-b"])


@pytest.fixture(scope="module", autouse=True)
def references(cluster, tmp_path_factory):
    """1 process × 4 devices: the default mesh (fsdp=4) and the multislice one (data=2 × fsdp=2).

    Started in the background once the cluster is up (a busy CPU can make a Ray node miss its
    fixed 30 s registration window), so it trains while the first groups form.
    """
    refs = References(tmp_path_factory.mktemp("reference"), devices=4, steps=STEPS,
                      overrides=OVERRIDES, variants={"multislice": MULTISLICE_MESH})
    try:
        yield refs
    finally:
        refs.close()


@pytest.fixture(scope="module")
def cfg():
    return load_config(None, OVERRIDES)


@pytest.fixture(scope="module")
def uninterrupted(cluster, cfg, tmp_path_factory):
    """2 hosts × 2 devices, STEPS steps in one go (checkpoints at RESUME_AT and STEPS)."""
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    run = train_group(cfg, cluster.hosts("pod"), run_dir, until=STEPS,
                      save_steps=[RESUME_AT, STEPS], hosts_per_slice=2)
    return run, run_dir


@pytest.fixture(scope="module")
def stopped(uninterrupted, tmp_path_factory):
    """The run as if it had stopped after RESUME_AT: a copy of its checkpoints without the later
    step (a save changes nothing in the math, so this is what a 2-host run stopped there left)."""
    _, run_dir = uninterrupted
    copy = tmp_path_factory.mktemp("remesh")
    shutil.copytree(run_dir / "checkpoints", copy / "checkpoints")
    shutil.rmtree(copy / "checkpoints" / str(STEPS))
    return copy


def test_two_hosts_form_one_group(uninterrupted):
    """Both actors joined one JAX runtime: 2 processes, 4 global devices, fsdp over all 4; each
    idled gloo's event loop."""
    run, _ = uninterrupted
    assert [i["process_index"] for i in run.init] == [0, 1]
    assert {(i["local_devices"], i["global_devices"], i["platform"]) for i in run.init} == {
        (2, 4, "cpu")}
    # each host put its one gloo event loop in the idle class (workers.host.gloo_loop)
    assert [i["gloo_loop_idled"] for i in run.init] == [1, 1]
    assert run.plan.shape.as_dict()["fsdp"] == 4
    assert run.mesh["axes"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert run.mesh["process_of_device"] == [[[0], [0], [1], [1]]]
    assert run.restored_step is None and run.start_step == 0
    assert len(run.losses) == STEPS
    assert run.losses[-1] < run.losses[0] - 0.1, run.losses


def test_two_hosts_match_single_process_on_four_devices(uninterrupted, references):
    """2 emulated hosts × 2 devices == 1 process × 4 devices: loss and params within 1e-6."""
    ref = references.get()
    run, _ = uninterrupted
    np.testing.assert_allclose(run.losses, ref.losses, rtol=0, atol=TOL)
    assert max_abs_diff(run.params, ref.params) <= TOL


def test_restore_two_host_checkpoint_onto_one_host(cluster, cfg, uninterrupted, stopped):
    """A 2-host (fsdp=4) checkpoint restores onto 1 host (fsdp=2) and training goes on."""
    whole, _ = uninterrupted
    copy = stopped
    run = train_group(cfg, cluster.hosts("ms-a"), copy, until=STEPS, save_steps=[STEPS],
                      hosts_per_slice=1)
    assert run.plan.num_processes == 1 and run.plan.shape.as_dict()["fsdp"] == 2
    assert (run.restored_step, run.start_step) == (RESUME_AT, RESUME_AT)
    assert run.mesh["process_of_device"] == [[[0], [0]]]
    assert len(run.losses) == STEPS - RESUME_AT
    # Same data, same math, another reduction order: equal to float32 rounding.
    np.testing.assert_allclose(run.losses, whole.losses[RESUME_AT:], rtol=0, atol=1e-5)
    assert max_abs_diff(run.params, whole.params) <= 1e-5
    assert (copy / "checkpoints" / str(STEPS)).is_dir()


def test_multislice_dcn_data_axis(cluster, cfg, tmp_path, references, uninterrupted):
    """2 slices × 1 host × 2 devices: data splits across slices (DCN), fsdp inside each one."""
    run = train_group(cfg, cluster.hosts("ms-a", "ms-b"), tmp_path, until=STEPS,
                      save_steps=[STEPS], hosts_per_slice=1)
    assert run.plan.slice_names == ("ms-a", "ms-b")
    mesh = run.plan.shape.as_dict()
    assert (mesh["dcn_data"], mesh["data"], mesh["fsdp"]) == (2, 2, 2)
    assert [h.slice_name for h in run.plan.hosts] == ["ms-a", "ms-b"]
    # Along `data`, row 0 lives on slice ms-a's host and row 1 on ms-b's: the axis crosses DCN.
    assert run.mesh["axes"] == {"data": 2, "fsdp": 2, "tensor": 1}
    assert run.mesh["process_of_device"] == [[[0], [0]], [[1], [1]]]
    assert run.losses[-1] < run.losses[0] - 0.1, run.losses
    # The same (data=2, fsdp=2) mesh in one process with 4 devices gives the same numbers.
    ref = references.get("multislice")
    np.testing.assert_allclose(run.losses, ref.losses, rtol=0, atol=TOL)
    assert max_abs_diff(run.params, ref.params) <= TOL
    # And the 1-slice run (fsdp=4 over 2 hosts) up to float32 reduction order.
    whole, _ = uninterrupted
    np.testing.assert_allclose(run.losses, whole.losses, rtol=0, atol=1e-5)
    assert max_abs_diff(run.params, whole.params) <= 1e-5


def test_foreign_checkpoint_is_a_checkpoint_error_and_untouched(cluster, cfg, tmp_path):
    """A step directory without our run metadata: a non-retryable CheckpointError naming the fix
    (not a group failure the controller would retry), and the directory left as it was."""
    (tmp_path / "checkpoints" / "5" / "state").mkdir(parents=True)
    (tmp_path / "checkpoints" / "5" / "state" / "junk").write_text("not orbax")
    before = snapshot(tmp_path / "checkpoints")
    group = Group(cfg, cluster.hosts("ms-a"), tmp_path, hosts_per_slice=1)
    try:
        with pytest.raises(CheckpointError) as info:
            group.form()
    finally:
        group.kill()
    assert not info.value.retryable
    assert "no readable run metadata" in info.value.message
    assert "run.run_dir" in info.value.fix
    assert snapshot(tmp_path / "checkpoints") == before
