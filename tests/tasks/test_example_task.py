"""The example user task (examples/my_task: a Flax NNX MLP outside orchestrator/ and workers/)
trains through the contract in one process (no Ray): its loss falls, its extra metric is
reported, and the run's FLOPs and tokens come from the task."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

TASK = ("task.kind=examples.my_task.task:make_task", "run.total_steps=60",
        "train.global_batch=32", "train.learning_rate=1e-2", "train.warmup_steps=5")


def test_example_task_trains_and_its_loss_falls(tmp_path):
    out = tmp_path / "mlp.npz"
    done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices", "4",
                           "--steps", "60", "--accum", "2", "--out", str(out), *TASK,
                           "mesh.ici.fsdp=2", "mesh.ici.tensor=2"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    got = np.load(out)
    losses = got["losses"]
    assert np.all(np.isfinite(losses))
    assert losses[-10:].mean() < 0.5 * losses[:10].mean(), losses
    assert got["extra:mae"].shape == (60,) and got["extra:mae"][-1] < got["extra:mae"][0]
    assert info["tokens_per_step"] == 32
    assert info["flops_analytic"] == 6.0 * 32 * (8 * 64 + 64 * 64 + 64)
    assert sorted(k for k in got.files if k.startswith("param:")) == [
        "param:head/bias", "param:head/kernel", "param:layers/0/bias", "param:layers/0/kernel",
        "param:layers/1/bias", "param:layers/1/kernel"]
