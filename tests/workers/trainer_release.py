"""Run in a subprocess (the device count is fixed per process): a Trainer that trained, saved
and was closed is freed by reference counting alone, with its arrays and executables, so a
warm process can clear its backends at once (``workers.host.warm``). Prints one JSON line."""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import weakref


def tr_steps(ckpt: str) -> list[int]:
    from orchestrator.shared import layout as ckpt_layout

    return ckpt_layout.committed_steps(ckpt)


def main() -> int:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    from jax.extend import backend

    from orchestrator.config import load_config
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import MeshPlan
    from workers.training.trainer import Trainer

    cfg = load_config(None, ["model.num_layers=1"])
    shape = cfg.validate_for(slices=1, hosts_per_slice=1, devices_per_host=2)
    host = HostRef(index=0, slice_name="local", worker_id=0, node_id="local",
                   node_ip="127.0.0.1", instance="local", devices=2)
    plan = MeshPlan(hosts=(host,), slice_names=("local",), shape=shape, devices_per_host=2,
                    platform="cpu")
    gc.disable()  # only reference counting may free it
    with tempfile.TemporaryDirectory() as ckpt:
        tr = Trainer(HostSpec.for_host(cfg, plan, host, checkpoint_dir=ckpt))
        tr.init_state(0)
        tr.compile()
        for _ in range(2):
            tr.train_step()
        manager_before_save = tr.ckpt._manager is not None  # made lazily: not in a switch
        tr.save(wait=True)
        during = len(jax.live_arrays())
        tr.close()
        ref = weakref.ref(tr)
        del tr
        jax.clear_caches()
        print(json.dumps({"manager_before_save": manager_before_save,
                          "saved": tr_steps(ckpt),
                          "arrays_while_training": during, "trainer_alive": ref() is not None,
                          "arrays": len(jax.live_arrays()),
                          "executables": len(backend.get_backend().live_executables())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
