"""Reference run: the same Trainer in ONE plain process with D CPU devices (no Ray, no group).

Run as ``python -m tests.integration.single_process --devices 4 --steps N --out F.npz k=v ...``
in a subprocess, so the device count is fixed there and never in the pytest process. Writes the
per-step losses, the final parameters (flattened by path) and the step's FLOP counts.
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
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    # Before JAX starts: XLA reads the device count once.
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"

    from orchestrator.config import load_config
    from orchestrator.hosts import HostRef
    from orchestrator.plan import MeshPlan
    from workers.trainer import Trainer

    cfg = load_config(None, args.overrides)
    shape = cfg.validate_for(slices=1, hosts_per_slice=1, devices_per_host=args.devices)
    host = HostRef(index=0, slice_name="local", worker_id=0, node_id="local", node_ip="127.0.0.1",
                   instance="local", devices=args.devices)
    plan = MeshPlan(hosts=(host,), slice_names=("local",), shape=shape,
                    devices_per_host=args.devices, platform="cpu")
    with tempfile.TemporaryDirectory() as ckpt:
        tr = Trainer(cfg, plan, checkpoint_dir=ckpt)
        tr.init_state(cfg.run.seed)
        tr.compile()
        losses = [tr.train_step().loss for _ in range(args.steps)]
        params = flatten(tr.params_host())
        tr.close()
    np.savez(args.out, **{f"param:{k}": v for k, v in params.items()},
             losses=np.asarray(losses, np.float64))
    print(json.dumps({"flops_xla": tr.flops_xla, "flops_analytic": tr.flops_analytic,
                      "mesh": shape.as_dict(), "n_params": tr.n_params,
                      "devices": len(tr.mesh.devices.flat)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
