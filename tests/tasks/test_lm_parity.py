"""The built-in LM through the task contract is the computation it was when it was hard-wired:
bit-identical parameters and losses after a few steps, with and without gradient accumulation,
and the same optimized step (its HLO without names and source locations). The reference is a
verbatim copy of the old path (tests/tasks/local_run.py); single process, 4 CPU devices."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

SMALL = ("run.total_steps=10", "model.num_layers=1", "model.d_model=32", "model.d_ff=64",
         "model.num_heads=2", "model.seq_len=16", "model.vocab_size=64", "train.global_batch=8",
         "train.warmup_steps=2")


def _run(tmp_path, *extra: str, accum: int = 1) -> tuple[dict, dict, dict]:
    out = tmp_path / f"run-{accum}.npz"
    done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices", "4",
                           "--steps", "3", "--accum", str(accum), "--out", str(out),
                           "--reference", *SMALL, *extra],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    new = dict(np.load(out))
    old = dict(np.load(str(out).removesuffix(".npz") + ".reference.npz"))
    return info, new, old


@pytest.mark.parametrize("accum", [1, 2])
def test_lm_through_the_contract_is_bit_identical_to_the_hard_wired_path(tmp_path, accum):
    info, new, old = _run(tmp_path, "mesh.ici.fsdp=2", "mesh.ici.tensor=2", accum=accum)
    assert sorted(new) == sorted(old)
    for k, v in old.items():
        np.testing.assert_array_equal(new[k], v, err_msg=k)
    assert info["hlo"] == info["reference_hlo"], "the jitted step is the same computation"
