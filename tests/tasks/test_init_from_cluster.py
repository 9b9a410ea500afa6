"""``task.init_from`` across processes: a group of 2 hosts × 2 CPU devices (Ray actors, one JAX
group) starts from a Hugging Face directory, each host placing its own devices' slices; its
first step's loss is transformers' reference loss; a group formed again on the run directory
after the Hugging Face directory is gone resumes the committed step (never reads it)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from orchestrator.config import load_config
from tests.integration.groups import train_group
from tests.support.ray_cluster import cluster_fixture
from tests.tasks.golden_llama import GOLDEN, MODEL

pytestmark = pytest.mark.cluster

cluster = cluster_fixture(layout=[2], names=["pod"])


def test_hosts_start_from_the_directory_and_resume_without_it(cluster, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN, hf)
    cfg = load_config(None, ["task.kind=tests.tasks.golden_llama:make_task",
                             f"task.init_from={hf}", *MODEL, "train.global_batch=2",
                             "mesh.ici.fsdp=2", "mesh.ici.tensor=2", "eval.every=0",
                             "run.total_steps=2"])
    run_dir = tmp_path / "run"
    first = train_group(cfg, cluster.hosts("pod"), run_dir, until=1, save_steps=[1],
                        hosts_per_slice=2)
    with np.load(GOLDEN / "reference.npz") as ref:
        reference = float(ref["loss"])
    print(f"2 hosts: first step loss {first.losses[0]!r}, reference {reference!r}")
    assert first.restored_step is None
    assert abs(first.losses[0] - reference) <= 1e-5
    hf.rename(tmp_path / "hf.moved")
    again = train_group(cfg, cluster.hosts("pod"), run_dir, until=2, save_steps=[],
                        hosts_per_slice=2)
    assert again.restored_step == 1 and again.start_step == 1
    assert np.isfinite(again.losses).all()
