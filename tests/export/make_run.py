"""A real run directory for the export tests, made in ONE plain process with 2 CPU devices (no
Ray): ``python -m tests.export.make_run --run-dir D --want F.npz``.

The real ``Trainer`` trains a tiny model over a 2-device mesh (parameters sharded over fsdp, so
the export must restore without the mesh they were saved from) and saves Orbax steps 1, 2 and 3;
step 4 goes to the RAM tier's durable store the way a holder writes it (``replica.pack`` of the
state, authenticated with the run's ``ram_secret``, ``copy_store.write``). Also left behind, as
a crash leaves them: Orbax step 5 never committed, RAM-tier step 6 without ``COMPLETE``.
``config.yaml`` is written as the driver writes it. ``F.npz`` holds what each step's state was
(``<step>:<path>``, parameters and optimizer state, gathered to the host) for the tests to compare
the export with.

``--task-run OVERRIDE ...`` instead: a run of the task the overrides name (``task.kind=...``),
one step trained and saved to Orbax, nothing else (the exported config's tests).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

SAVED, COPIED, UNCOMMITTED, INCOMPLETE = (1, 2, 3), 4, 5, 6


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--want")
    p.add_argument("--task-run", nargs="+", metavar="OVERRIDE")
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    if args.task_run:
        make_task_run(Path(args.run_dir), args.task_run)
    else:
        make(Path(args.run_dir), Path(args.want))
    return 0


def _trainer(run_dir: Path, overrides: list[str]):
    """A Trainer of the config ``overrides`` give, on one host of 2 CPU devices, with the run's
    ``config.yaml`` written as the driver writes it."""
    import yaml

    from orchestrator.config import load_config
    from orchestrator.shared import configtools
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import MeshPlan
    from workers.training.trainer import Trainer

    cfg = load_config(None, [f"run.run_dir={run_dir}", "run.total_steps=20", "compile.cache=off",
                             "cluster.emulate.hosts_per_slice=1", "checkpoint.keep=5",
                             *overrides])
    shape = cfg.validate_for(slices=1, hosts_per_slice=1, devices_per_host=2)
    host = HostRef(index=0, slice_name="local", worker_id=0, node_id="local", node_ip="127.0.0.1",
                   instance="local", devices=2)
    plan = MeshPlan(hosts=(host,), slice_names=("local",), shape=shape, devices_per_host=2,
                    platform="cpu")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(configtools.to_dict(cfg),
                                                        sort_keys=False))
    return cfg, Trainer(HostSpec.for_host(cfg, plan, host,
                                          checkpoint_dir=str(run_dir / "checkpoints")))


def make_task_run(run_dir: Path, overrides: list[str]) -> None:
    _, tr = _trainer(run_dir, overrides)
    tr.init_state(tr.spec.seed)
    tr.compile()
    tr.train_step()
    tr.save(wait=True)
    tr.close()


def make(run_dir: Path, want: Path) -> None:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from orchestrator.raygroup.ram_holders import run_secret
    from workers.ram import auth as ram_auth
    from workers.ram import copy_store, replica

    cfg, tr = _trainer(run_dir, [])
    ckpt = run_dir / "checkpoints"
    tr.init_state(cfg.run.seed)
    tr.compile()
    arrays: dict[str, np.ndarray] = {}
    for step in range(1, UNCOMMITTED + 1):
        tr.train_step()
        state = multihost_utils.process_allgather(
            {"params": tr.state["params"], "opt_state": tr.state["opt_state"]}, tiled=True)
        for path, leaf in jax.tree_util.tree_leaves_with_path(state):
            arrays[f"{step}:{_name(path)}"] = np.asarray(leaf)
        if step in SAVED or step == UNCOMMITTED:
            tr.save(wait=True)
        if step == COPIED:
            token, _ = run_secret(run_dir)
            layout, data = replica.pack(tr.state)
            mac = ram_auth.copy_mac(ram_auth.Keys.from_token(token).copy, incarnation=1,
                                    step=step, source=0, sources=1, layout=layout, data=data)
            copy_store.write(copy_store.copies_dir(ckpt), step=step, source=0, sources=1,
                             incarnation=1, layout=layout, data=data, mac=mac)
    tr.close()
    # a save that died before its commit; a RAM-tier step whose other source never arrived
    (ckpt / str(UNCOMMITTED) / "commit_success.txt").unlink()
    partial = copy_store.copies_dir(ckpt) / str(INCOMPLETE)
    partial.mkdir()
    shutil.copytree(copy_store.copies_dir(ckpt) / str(COPIED) / "source-0",
                    partial / "source-0")
    np.savez(want, **arrays)


def _name(path: tuple) -> str:
    """``params/block0/attn/q/kernel`` from a JAX key path (the export's naming)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    return "/".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
