"""``task.init_from`` through the Trainer in ONE plain process with 4 CPU devices (no Ray).

``python -m tests.tasks.init_from_run --work TMP`` in a subprocess (the device count is fixed
there, never in pytest's process). The task is the ``llama`` task with the golden's input ids as
its rows (``tests.tasks.golden_llama``), the parameters sharded over fsdp=2 × tensor=2. It
starts a run from a copy of the golden directory, compares the placed parameters with the whole
tree read on the host, trains one step, saves it, renames the Hugging Face directory away,
restores the step in a new Trainer, and tries a new run without the directory. Prints one JSON
line of what it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    print(json.dumps(run(Path(args.work))), flush=True)
    return 0


def run(work: Path) -> dict:
    from orchestrator.shared.errors import ConfigError
    from tests.integration.single_process import flatten
    from tests.tasks.golden_llama import GOLDEN, MODEL
    from tests.tasks.local_run import _spec
    from workers.models import hf_llama
    from workers.training.trainer import Trainer

    hf = work / "hf"
    shutil.copytree(GOLDEN, hf)
    overrides = ["task.kind=tests.tasks.golden_llama:make_task", f"task.init_from={hf}",
                 *MODEL, "train.global_batch=2", "mesh.ici.fsdp=2", "mesh.ici.tensor=2",
                 "eval.every=0"]
    args = argparse.Namespace(overrides=overrides, devices=4, accum=1, store=None)
    out: dict = {}
    _, spec = _spec(args, str(work / "ckpt"))
    tr = Trainer(spec)
    reads = _count_reads(tr.task.init_from)
    out["fresh_restore_step"] = tr.restore().step  # no committed step: the init, then the load
    out["reads"] = len(reads)
    maps = [a.sharding.devices_indices_map(a.shape) for a in _leaves(tr.state["params"])]
    out["device_slices"] = sum(len(m) for m in maps)
    out["distinct_slices"] = sum(len({tuple((s.start, s.stop) for s in i) for i in m.values()})
                                 for m in maps)
    placed = flatten(tr.params_host())
    whole = flatten(hf_llama.load_tree(hf, tr.task.init_from.cfg))
    out["placed_keys_equal"] = sorted(placed) == sorted(whole)
    out["placed_bit_equal"] = all(np.array_equal(placed[k], whole[k]) for k in whole)
    out["shardings"] = sorted({str(a.sharding.spec) for a in _leaves(tr.state["params"])})
    out["first_loss"] = tr.train_step().loss
    tr.save(wait=True)
    saved = flatten(tr.params_host())
    tr.close()

    hf.rename(work / "hf.moved")  # a resume must not need it
    tr = Trainer(spec)
    out["resumed_step"] = tr.restore().step
    resumed = flatten(tr.params_host())
    out["resumed_equal"] = all(np.array_equal(saved[k], resumed[k]) for k in saved)
    tr.close()

    _, spec = _spec(args, str(work / "ckpt-new"))  # a new run does need it
    tr = Trainer(spec)
    try:
        tr.restore()
        out["new_run_error"] = None
    except ConfigError as exc:
        out["new_run_error"] = {"setting": exc.setting, "message": str(exc)}
    tr.close()
    return out


def _count_reads(source) -> list:
    """Every ``read`` the source is asked (path, index), in a list the caller keeps."""
    reads: list = []
    read = source.read

    def counted(path, index):
        reads.append((path, index))
        return read(path, index)

    source.read = counted
    return reads


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
