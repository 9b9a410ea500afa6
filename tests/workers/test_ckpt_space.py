"""A save that cannot fit on the checkpoint disk is refused before it starts, with ENOSPC the
driver maps to a storage fault (issue 28, item 7: inside Orbax's async commit the same error
left the primary's peers waiting at a barrier until the step bound, then retried)."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from orchestrator.raygroup.results import storage_fault
from workers.training import ckpt_space
from workers.training.checkpoints import CheckpointStore


def _store(tmp_path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "ckpt", keep=2, async_save=False,
                           model_fingerprint="f", model_desc="tiny")


STATE = {"w": np.zeros((256, 64), np.float32), "step": np.int32(5)}


def test_a_save_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    need = ckpt_space.state_bytes(STATE)
    assert need == 256 * 64 * 4 + 4
    monkeypatch.setattr(ckpt_space, "free_bytes", lambda d: need - 1)
    store = _store(tmp_path)
    with pytest.raises(OSError) as err:
        store.save(5, STATE, {"step": 5})
    assert err.value.errno == errno.ENOSPC
    assert "free space" not in str(err.value) and storage_fault(err.value) is not None
    assert not (tmp_path / "ckpt" / "5").exists() and store.committed_step() is None


def test_a_save_that_fits_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt_space, "free_bytes", lambda d: ckpt_space.state_bytes(STATE))
    store = _store(tmp_path)
    assert store.save(5, STATE, {"step": 5})
    assert store.committed_step() == 5


def test_free_bytes_of_a_directory_not_made_yet_and_of_a_remote_path(tmp_path):
    assert ckpt_space.free_bytes(str(tmp_path / "not" / "yet")) > 0
    assert ckpt_space.free_bytes("gs://bucket/run/checkpoints") is None
    ckpt_space.check_room("gs://bucket/run/checkpoints", 1 << 60)  # not checked: no raise
