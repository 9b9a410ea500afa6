"""The input pipeline through the task API (examples/text_lm): the driver's task check opens
and verifies the data, so bad data is exit 2 before anything starts; the trainer, asking each
device's rows, trains on the same batches with 1 and 4 devices."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.data.manifest import load
from orchestrator.driver.task_check import run_check
from orchestrator.shared.errors import ConfigError
from tests.input.conftest import SEQ_LEN, VOCAB

ROOT = Path(__file__).resolve().parents[2]
KIND = "task.kind=examples.text_lm.task:make_task"


def _overrides(data_dir: str) -> list[str]:
    return [KIND, f"task.data.dir={data_dir}", f"task.vocab_size={VOCAB}",
            f"task.seq_len={SEQ_LEN}", "task.d_model=32", "task.d_ff=64", "task.num_heads=2",
            "train.global_batch=8", "run.total_steps=20"]


def test_the_task_check_opens_the_data_and_refuses_a_missing_shard(check_here, datasets, tmp_path):
    """The check passes on good data; with a shard gone it names task.data.dir and the fix."""
    good = run_check(load_config(None, _overrides(datasets["arrayrecord"])))
    assert good.tokens_per_step == 8 * (SEQ_LEN - 1)
    broken = tmp_path / "broken"
    shutil.copytree(datasets["bin"], broken)
    (broken / load(str(broken)).shards[0].path).unlink()
    with pytest.raises(ConfigError) as err:
        run_check(load_config(None, _overrides(str(broken))))
    assert err.value.setting == "task.data.dir" and "missing" in err.value.message
    assert "prepare" in err.value.fix


def test_main_exits_2_on_bad_data_before_the_group_forms(datasets, tmp_path):
    """orchestrator.main with data of a larger vocabulary than the model's: exit 2, nothing
    started, the message names task.vocab_size."""
    run_dir = tmp_path / "run"
    args = [*_overrides(datasets["bin"]), f"task.vocab_size={VOCAB // 2}",
            f"run.run_dir={run_dir}"]
    done = subprocess.run([sys.executable, "-m", "orchestrator.main", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    text = " ".join(done.stderr.split())
    assert "task.vocab_size" in text and "Fix:" in text, text[-2000:]
    assert not (run_dir / "checkpoints").exists()
    assert "emulated_cluster_started" not in done.stdout + done.stderr


def _train(data_dir: str, devices: int, out: Path) -> np.ndarray:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices",
                           str(devices), "--steps", "4", "--accum", "2", "--out", str(out),
                           *_overrides(data_dir), "compile.cache=off"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)["losses"]


def test_the_trainer_reads_the_same_batches_on_1_and_4_devices(datasets, tmp_path):
    """The trainer asks each device's rows of each micro-batch; 4 devices train on exactly
    the batches 1 device does (the same losses, step after step)."""
    one = _train(datasets["bin"], 1, tmp_path / "one.npz")
    four = _train(datasets["bin"], 4, tmp_path / "four.npz")
    assert one.shape == (4,) and np.all(np.isfinite(one))
    np.testing.assert_allclose(four, one, rtol=2e-5)
