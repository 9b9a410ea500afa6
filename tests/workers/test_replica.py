"""RAM-tier copies on real JAX (one subprocess with 4 CPU devices, ``replica_scenarios``): a copy
restores bit-identically into the same mesh and into another one; damaged, incomplete and
foreign copies are refused with a reason; a holder keeps only the newest copies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("replica") / "scenarios.json"
    proc = subprocess.run([sys.executable, "-m", "tests.workers.replica_scenarios", "--out",
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert "error" not in got, got.get("error")
    return got


def test_copy_restores_into_the_same_mesh_and_training_goes_on_bit_identically(seen):
    assert seen["same_restore"]["ok"] is True
    assert seen["same_restore"]["step"] == 3
    assert seen["same_restore"]["nbytes"] == seen["nbytes"] > 0
    assert seen["same_equal"] is True, "3 steps, copy, restore, 3 more == 6 uninterrupted"


def test_copy_restores_into_a_reformed_mesh(seen):
    assert seen["other_axes"] == {"data": 1, "fsdp": 2, "tensor": 2}
    assert seen["other_restore"]["ok"] is True
    assert seen["other_params_equal_at_3"] is True


def test_damaged_copy_is_refused_by_holder_and_reader(seen):
    assert [c["intact"] for c in seen["inventory_after_damage"]] == [False]
    refused = seen["damaged_restore"]
    assert refused["ok"] is False
    assert "fails its authentication" in refused["reason"]


def test_a_copy_of_another_step_or_run_is_refused_before_use(seen):
    assert seen["wrong_step_restore"]["ok"] is False
    assert "is of step 3, not 4" in seen["wrong_step_restore"]["reason"]
    assert seen["other_secret_restore"]["ok"] is False
    assert "fails its authentication" in seen["other_secret_restore"]["reason"]


def test_incomplete_and_foreign_copies_are_refused(seen):
    assert "a source is missing" in seen["incomplete"]
    assert "different model" in seen["other_model"]
    assert "array" in seen["other_model"] and "here" in seen["other_model"]


def test_holder_keeps_the_newest_copies_per_writer(seen):
    assert seen["kept_steps"] == [4, 5]


def test_copies_saved_by_the_holders_complete_only_with_every_source(seen):
    disk = seen["disk"]
    assert disk["first_of_two_completes"] is False and disk["complete_after_one"] == []
    assert disk["second_completes"] is True and disk["complete_after_two"] == [3]
    assert disk["read_back_equal"] is True
    assert disk["restore_ok"] is True
    assert disk["pruned"] == [3] and disk["after_prune"] == [4]


def test_a_packer_worked_out_once_packs_later_states_like_pack(seen):
    assert seen["packer_equals_pack"] is True
    assert seen["packer_reuses_released"] is True


def test_a_packer_refuses_a_state_on_another_mesh(seen):
    """The Packer finds shards by position, valid only for the sharding it was made for."""
    assert "make a new Packer for a new mesh" in seen["packer_other_mesh"]


def test_a_host_fetches_only_the_sources_its_shards_need_and_refuses_too_few(seen):
    assert seen["needed_sources"] == [0]
    assert "covered" in seen["incomplete_placed"]
