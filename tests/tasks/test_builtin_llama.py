"""The Llama family (workers/models/llama.py) is a built-in task like lm: ``task.kind=llama``
with a preset and ``task.model.*`` overrides, checked on the driver and trained through the
contract (single process, a tiny preset)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.driver.task_check import run_check
from orchestrator.shared.errors import ConfigError

TINY = ("task.kind=llama", "task.preset=tiny", "task.model.num_layers=1")


def test_llama_passes_the_check_and_a_bad_override_names_its_setting(check_here):
    ok = run_check(load_config(None, list(TINY)))
    assert ok.task["settings"] == {"preset": "tiny", "model": {"num_layers": 1},
                                   "init_from": None, "data": None}
    assert ok.tokens_per_step == 16 * 31 and ok.flops_per_step > 0
    with pytest.raises(ConfigError) as info:
        run_check(load_config(None, [*TINY, "task.model.num_kv_heads=3"]))
    assert info.value.setting == "task.model.num_kv_heads"


def test_how_attention_computes_does_not_change_which_checkpoints_fit(check_here):
    """A run saved with plain attention (or remat) resumes with fused: the fingerprint leaves
    the numerics-only fields out; a field that changes the state still changes it."""
    def fingerprint(*extra: str) -> str:
        return run_check(load_config(None, [*TINY, *extra])).fingerprint

    fused = fingerprint()
    assert fingerprint("task.model.attention=plain") == fused
    assert fingerprint("task.model.attention=plain", "task.model.remat=true") == fused
    assert fingerprint("task.model.num_layers=2") != fused
    assert fingerprint("task.model.attention=plain", "task.model.num_layers=2") == \
        fingerprint("task.model.num_layers=2")


def test_llama_trains_through_the_contract(tmp_path):
    out = tmp_path / "llama.npz"
    done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices", "4",
                           "--steps", "8", "--out", str(out), *TINY, "train.global_batch=8",
                           "train.warmup_steps=2", "mesh.ici.fsdp=2", "mesh.ici.tensor=2"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    losses = np.load(out)["losses"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert info["tokens_per_step"] == 8 * 31
