"""Peer baseline: Ray Train's JaxTrainer with the same model, in two modes.

``python -m bench.raytrain_baseline --minutes M --preempt-every-s N --workdir DIR`` (figure 4):
starts a local Ray instance (CPU), runs ``ray.train.v2.jax.JaxTrainer`` (``JaxConfig(use_tpu=True)``
and ``JAX_PLATFORMS=cpu`` in the workers, which makes it initialise ``jax.distributed`` on CPU)
with the project's Trainer, Orbax checkpoints every K steps in a shared directory, and kills one
worker process every N seconds (unannounced). Stops itself after M minutes.

``--address auto --workdir DIR`` (the standing-cluster figure, ``bench.standing``): submitted
with ``ray job submit`` to a standing local TPU-like cluster, its workers on the emulated TPU
hosts, and Ray Train's own preemption lifecycle on: its ``PreemptionWatcher`` reads Ray Core's
node drains (polled every second), the loop asks ``ray.train.get_preemption_info()`` every
``--check-every`` steps, saves a just-in-time checkpoint at once, a last one just before the
deadline and then waits to be torn down (steps after it would be lost), and
``FailureConfig(max_failures=-1, max_preemption_failures=-1)`` restarts the group on the nodes
left. Runs until the job is stopped.

Rank 0 appends one JSON line per step to DIR/records.jsonl (and a restore marker per start);
every rank writes its Ray node id to DIR/nodes/rank<R>; lifecycle events go to
DIR/lifecycle.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path


def train_loop(config: dict) -> None:
    """Runs in every Ray Train worker: restore the latest checkpoint (or init), train, save."""
    import jax
    import ray
    import ray.train

    from orchestrator.config import load_config
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import MeshPlan
    from workers.host.gloo_loop import idle_after_join
    from workers.training.trainer import Trainer

    ctx = ray.train.get_context()
    rank, n = ctx.get_world_rank(), ctx.get_world_size()
    workdir = Path(config["workdir"])
    (workdir / "pids").mkdir(parents=True, exist_ok=True)
    (workdir / "pids" / f"rank{rank}").write_text(str(os.getpid()))
    (workdir / "nodes").mkdir(exist_ok=True)
    (workdir / "nodes" / f"rank{rank}").write_text(ray.get_runtime_context().get_node_id())
    cfg = load_config(None, config["overrides"])
    # gloo's event loop idled as the orchestrator's hosts idle it (``workers.host.gloo_loop``)
    idle_after_join(n)
    dev = jax.local_device_count()
    shape = cfg.validate_for(slices=1, hosts_per_slice=n, devices_per_host=dev)
    hosts = tuple(HostRef(index=i, slice_name="rt", worker_id=i, node_id=f"rt-{i}",
                          node_ip="127.0.0.1", instance=f"rt-w{i}", devices=dev)
                  for i in range(n))
    plan = MeshPlan(hosts=hosts, slice_names=("rt",), shape=shape, devices_per_host=dev,
                    platform="cpu")
    tr = Trainer(HostSpec.for_host(cfg, plan, hosts[rank],
                                   checkpoint_dir=str(workdir / "checkpoints")))
    restored = tr.restore().step  # the seed's state when nothing is committed
    every = int(config["checkpoint_every"])
    end_at = float(config["end_at"])
    out = (workdir / "records.jsonl").open("a", encoding="utf-8") if rank == 0 else None
    if out is not None and restored is not None:
        out.write(json.dumps({"step": restored, "restored": True, "wall_time": time.time()}) + "\n")
        out.flush()
    tr.compile()
    if config.get("standing"):
        _standing_loop(tr, workdir, out, rank, every, int(config["check_every"]))
        return
    try:
        # Every process must agree on when to stop: the same step-boundary decision everywhere.
        from jax.experimental import multihost_utils

        while True:
            if tr.step % 10 == 0:  # a collective every step would tax this baseline
                stop = multihost_utils.broadcast_one_to_all(
                    jax.numpy.asarray(time.time() >= end_at, dtype=jax.numpy.int32))
                if int(stop):
                    break
            _step(tr, every, out)
    finally:
        if out is not None:
            out.close()
    tr.close()


def _step(tr, every: int, out):
    """One step, a save on the interval, and rank 0's record of it."""
    o = tr.train_step()
    if o.step % every == 0:
        tr.save()
    if out is not None:
        out.write(json.dumps({"step": o.step, "step_time_s": o.step_time_s,
                              "wall_time": time.time(), "pid": os.getpid()}) + "\n")
        out.flush()
    return o


def _lifecycle(workdir: Path, rank: int, **record: object) -> None:
    if rank == 0:
        with (workdir / "lifecycle.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps({"at": time.time(), **record}) + "\n")


def _standing_loop(tr, workdir: Path, out, rank: int, every: int, check_every: int) -> None:
    """Train until torn down, with Ray Train's preemption path: a just-in-time checkpoint when
    a preemption is announced, a last one just before its deadline, then wait (no step that
    would be lost). Every decision is the same on every rank (a broadcast of rank 0's)."""
    import jax
    import ray.train
    from jax.experimental import multihost_utils

    saved_for: int | None = None  # the deadline whose just-in-time checkpoint is written
    margin_s = 1.0
    recent: list[float] = []  # the last steps' times
    try:
        while True:
            if tr.step % check_every == 0:
                info = ray.train.get_preemption_info()
                if info is not None and info.deadline_ms:
                    if saved_for != info.deadline_ms:
                        t0 = time.time()
                        tr.save(wait=True)
                        save_s = time.time() - t0
                        # the last save starts this long before the deadline: two saves and
                        # the steps between two checks (at the recent step time), plus a second
                        step_s = statistics.median(recent) if recent else 0.5
                        margin_s = 2 * save_s + check_every * step_s + 1.0
                        saved_for = info.deadline_ms
                        _lifecycle(workdir, rank, event="jit_checkpoint", step=tr.step,
                                   deadline_ms=info.deadline_ms, save_s=round(save_s, 3))
                    late = info.deadline_ms / 1000.0 - time.time() <= margin_s
                    if int(multihost_utils.broadcast_one_to_all(
                            jax.numpy.asarray(late, dtype=jax.numpy.int32))):
                        tr.save(wait=True)
                        _lifecycle(workdir, rank, event="last_checkpoint", step=tr.step,
                                   deadline_ms=info.deadline_ms)
                        while True:  # Ray Train tears the group down at the deadline
                            time.sleep(1.0)
            o = _step(tr, every, out)
            recent = [*recent[-9:], o.step_time_s]
    finally:
        if out is not None:
            out.close()


def _preempter(workdir: Path, every_s: float, stop: threading.Event, log: list[dict]) -> None:
    """Every ``every_s`` after the first step: SIGKILL the rank-1 worker (host lost, no notice)."""
    pid_file = workdir / "pids" / "rank1"
    while not (workdir / "records.jsonl").exists():
        if stop.wait(0.5):
            return
    while not stop.wait(every_s):
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            log.append({"at": time.time(), "pid": pid})
        except (OSError, ValueError):
            log.append({"at": time.time(), "pid": None, "skipped": "no live rank-1 worker"})


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.raytrain_baseline")
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--preempt-every-s", type=float, default=None)
    p.add_argument("--address", default=None,
                   help="a standing cluster (auto: the job's): Ray Train's preemption path, "
                        "notices from node drains, no kills of its own")
    p.add_argument("--check-every", type=int, default=10,
                   help="steps between ray.train.get_preemption_info() calls (a barrier)")
    p.add_argument("--workdir", required=True)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--checkpoint-every", type=int, default=10)
    args = p.parse_args(argv)
    if args.address is not None:
        return standing(args)
    if args.minutes is None or args.preempt_every_s is None:
        p.error("--minutes and --preempt-every-s are required without --address")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxConfig, JaxTrainer

    workdir = Path(args.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"JAX_PLATFORMS": "cpu", "RAY_TRAIN_V2_ENABLED": "1",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    for attempt in range(3):  # a loaded machine can miss Ray's fixed 30 s raylet start bound
        try:
            # address="local": always a fresh instance, never another job's cluster on this host.
            ray.init(address="local", num_cpus=args.hosts, include_dashboard=False,
                     runtime_env={"env_vars": env})
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    started = time.time()
    stop = threading.Event()
    kills: list[dict] = []
    killer = threading.Thread(target=_preempter, args=(workdir, args.preempt_every_s, stop, kills),
                              daemon=True)
    try:
        trainer = JaxTrainer(
            train_loop,
            train_loop_config={"workdir": str(workdir), "overrides": ["run.total_steps=1000000"],
                               "checkpoint_every": args.checkpoint_every,
                               "end_at": started + args.minutes * 60.0},
            jax_config=JaxConfig(use_tpu=True),
            scaling_config=ScalingConfig(num_workers=args.hosts,
                                         resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name="bench-raytrain", storage_path=str(workdir / "ray"),
                                 failure_config=FailureConfig(max_failures=-1)))
        killer.start()
        error = None
        try:
            trainer.fit()
        except Exception as exc:  # reported, not raised: the benchmark records what happened
            error = f"{type(exc).__name__}: {exc}"
    finally:
        stop.set()
        ray.shutdown()
    (workdir / "summary.json").write_text(json.dumps({
        "started_at": started, "ended_at": time.time(), "kills": kills, "error": error}))
    return 0 if error is None else 1


def standing(args: argparse.Namespace) -> int:
    """On a standing cluster (``ray job submit``): Ray Train at its best against preemptions."""
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxConfig, JaxTrainer

    from orchestrator.raygroup.topology import EMULATED_LABEL

    workdir = Path(args.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    ray.init(address=args.address)
    trainer = JaxTrainer(
        train_loop,
        train_loop_config={"workdir": str(workdir), "overrides": ["run.total_steps=1000000"],
                           "checkpoint_every": args.checkpoint_every, "standing": True,
                           "check_every": args.check_every, "end_at": 0.0},
        jax_config=JaxConfig(use_tpu=True),
        # One worker per emulated TPU host (each has one CPU). Ray Train's TPU slice
        # reservation (ScalingConfig(use_tpu=True, topology=..., accelerator_type=...)) needs
        # a real TPU accelerator type, which CPU hosts cannot advertise.
        scaling_config=ScalingConfig(num_workers=args.hosts, resources_per_worker={"CPU": 1},
                                     label_selector={EMULATED_LABEL: "true"}),
        run_config=RunConfig(name="bench-raytrain-standing", storage_path=str(workdir / "ray"),
                             failure_config=FailureConfig(max_failures=-1,
                                                          max_preemption_failures=-1)))
    try:
        trainer.fit()
    except Exception as exc:
        print(f"Ray Train ended: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
