"""Reference run: the same Trainer in ONE plain process with D CPU devices (no Ray, no group).

Run as ``python -m tests.integration.single_process --devices 4 --steps N --out F.npz k=v ...``
in a subprocess, so the device count is fixed there and never in the pytest process. Writes the
per-step losses and the final parameters (flattened by path) to ``F.npz``, and prints the step's
FLOP counts as one JSON line. ``--variant NAME=k=v,k=v`` adds a run with extra overrides in the
same process (written to ``F.NAME.npz``): one JAX start-up for several references.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """Nested dict of arrays -> {"a/b/c": array}; the same keys for host-actor and local params."""
    out: dict[str, np.ndarray] = {}
    for k in sorted(tree):
        v = tree[k]
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, key))
        else:
            out[key] = np.asarray(v)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--variant", action="append", default=[])
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    # Before JAX starts: XLA reads the device count once.
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"

    runs = [(args.out, list(args.overrides))]
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        runs.append((args.out.removesuffix(".npz") + f".{name}.npz",
                     [*args.overrides, *[o for o in extra.split(",") if o]]))
    for out, overrides in runs:
        info = _run(args.devices, args.steps, out, overrides)
        print(json.dumps(info), flush=True)
    return 0


def _run(devices: int, steps: int, out: str, overrides: list[str]) -> dict:
    from orchestrator.config import load_config
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import MeshPlan
    from workers.training.trainer import Trainer

    cfg = load_config(None, overrides)
    shape = cfg.validate_for(slices=1, hosts_per_slice=1, devices_per_host=devices)
    host = HostRef(index=0, slice_name="local", worker_id=0, node_id="local", node_ip="127.0.0.1",
                   instance="local", devices=devices)
    plan = MeshPlan(hosts=(host,), slice_names=("local",), shape=shape,
                    devices_per_host=devices, platform="cpu")
    with tempfile.TemporaryDirectory() as ckpt:
        tr = Trainer(HostSpec.for_host(cfg, plan, host, checkpoint_dir=ckpt))
        tr.init_state(cfg.run.seed)
        tr.compile()
        losses = [tr.train_step().loss for _ in range(steps)]
        params = flatten(tr.params_host())
        tr.close()
    np.savez(out, **{f"param:{k}": v for k, v in params.items()},
             losses=np.asarray(losses, np.float64))
    return {"out": out, "flops_xla": tr.flops_xla, "flops_analytic": tr.flops_analytic,
            "mesh": shape.as_dict(), "n_params": tr.n_params,
            "devices": len(tr.mesh.devices.flat)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
