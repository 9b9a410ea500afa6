"""One process of the bare multi-process JAX loop: the baseline with no Ray and no orchestrator.

``python -m bench.bare_worker --process-id I --num-processes N --coordinator 127.0.0.1:P ...``.
The same Trainer (model, batch, mesh, jitted step, Orbax I/O) the host actors run, joined by
``jax.distributed.initialize`` on loopback, gloo's event loop idled as the hosts idle it
(``workers.host.gloo_loop``: the comparison is of the orchestrator, not of gloo's busy-polling).
Process 0 writes one JSON with per-step timings:
step time, whether an async save was in flight when the step started, and the blocking part of a
save issued after the step (figure 5).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bare_worker")
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--coordinator", required=True)
    p.add_argument("--devices", type=int, required=True, help="CPU devices per process")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: never save")
    p.add_argument("--out", required=True)
    p.add_argument("--init-timeout-s", type=int, default=120)
    p.add_argument("--gloo-loop", choices=("idle", "busy"), default="idle",
                   help="busy: leave gloo's event loop as JAX starts it (bench.gloo_loop)")
    p.add_argument("overrides", nargs="*", help="RunConfig key.sub=value settings")
    args = p.parse_args(argv)
    # XLA reads the device count once, before the backend starts: set it before importing JAX.
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"

    import jax

    from orchestrator.config import load_config
    from orchestrator.shared.host_env import store_dir
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import MeshPlan
    from workers.host.gloo_loop import idle_after_join
    from workers.training.trainer import Trainer

    t_start = time.time()
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes, process_id=args.process_id,
                               initialization_timeout=args.init_timeout_s,
                               heartbeat_timeout_seconds=20)
    idled = idle_after_join(args.num_processes) if args.gloo_loop == "idle" else []
    cfg = load_config(None, args.overrides)
    n = args.num_processes
    shape = cfg.validate_for(slices=1, hosts_per_slice=n, devices_per_host=args.devices)
    hosts = tuple(HostRef(index=i, slice_name="bare", worker_id=i, node_id=f"bare-{i}",
                          node_ip="127.0.0.1", instance=f"bare-w{i}", devices=args.devices)
                  for i in range(n))
    plan = MeshPlan(hosts=hosts, slice_names=("bare",), shape=shape,
                    devices_per_host=args.devices, platform="cpu")
    # the same executable store an orchestrated run of this config uses (compile.dir, else
    # $TPU_ORCH_EXECUTABLES_DIR, else next to the checkpoints): a fair baseline
    store = store_dir(cfg.compile.dir, Path(args.checkpoint_dir).parent, os.environ)
    tr = Trainer(HostSpec.for_host(cfg, plan, hosts[args.process_id],
                                   checkpoint_dir=args.checkpoint_dir, executables_dir=store))
    tr.init_state(cfg.run.seed)
    compile_s = tr.compile()
    records: list[dict] = []
    manager = tr.ckpt.manager
    for _ in range(args.steps):
        in_flight = bool(manager.is_saving_in_progress())
        out = tr.train_step()
        blocking = 0.0
        if args.checkpoint_every and out.step % args.checkpoint_every == 0:
            blocking = tr.save().blocking_s
        records.append({"step": out.step, "step_time_s": out.step_time_s, "loss": out.loss,
                        "save_in_flight": in_flight, "save_blocking_s": blocking,
                        "wall_time": time.time()})
    tr.close()
    if args.process_id == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"started_at": t_start, "compile_s": compile_s, "records": records,
                       "processes": n, "devices_per_process": args.devices,
                       "gloo_loop_idled": len(idled),
                       "mesh": shape.as_dict()}, f)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
