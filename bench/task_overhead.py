"""``python -m bench.task_overhead``: what does the task API cost per step?

One process, D CPU devices (``--devices``, 4: the default topology's mesh, fsdp=4), the same
model, optimizer, loss, batch, mesh and shardings, stepped two ways in interleaved pairs (A B,
then B A, ...):

- **task**: ``workers.training.trainer.Trainer.train_step``, the real host code path: the built-in
  ``lm`` task resolved through the task contract (``workers/task/``), its batch built from the
  task's ``rows``, the contract's jitted step, one device→host copy of its metrics;
- **hard-wired**: the step as it was before tasks existed (``workers/trainer.py`` at the parent
  of 5d6d088, now ``workers/training/trainer.py``), kept verbatim in ``tests/tasks/local_run.py``
  (the parity test's reference: same optimized HLO, bit-identical parameters): ``DecoderLM`` +
  AdamW/warmup-cosine built directly, the batch from ``workers.training.data.make_rows``, the old
  ``_train_step`` jitted with the same shardings, the same three metrics copied to the host.

Each timed step is batch + step + metrics on the host (``perf_counter`` around it, the same for
both). Both arms run the same steps from the same seed, so their losses must agree: the bench
says so, or warns. Prints the median step of each arm (median of the pairs' medians), the ratio
task / hard-wired per pair (median [min–max], n), and the 1-minute load at the start and end:
a start at ``bench.machine.IDLE_LOAD_1MIN`` or more is marked NOT A RESULT.

    python -m bench.task_overhead [--pairs 10] [--steps 50] [--devices 4] [--accum 1] [k=v ...]

``k=v`` are config overrides as for ``orchestrator.main`` (``model.d_model=256``, ...); only the
built-in ``lm`` has a hard-wired twin.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.machine import IDLE_LOAD_1MIN, describe, load_average
from bench.stats import fmt_spread, spread

ARMS = ("hard-wired", "task")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.task_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=10, help="interleaved pairs (A B / B A)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per arm and pair")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per arm first")
    p.add_argument("--devices", type=int, default=4, help="CPU devices of the one process")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("overrides", nargs="*", help="config overrides (key.sub=value)")
    args = p.parse_args(list(argv))
    for name in ("pairs", "steps", "devices", "accum"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if any(o.split("=", 1)[0].startswith("task.") for o in args.overrides):
        p.error("task.* overrides: only the built-in lm task has a hard-wired twin")
    return args


def _task_arm(args: argparse.Namespace, ckpt: str) -> tuple[Callable[[], float], Any, Any]:
    """The Trainer through the task contract: (one step → its loss, the Trainer, the mesh
    plan)."""
    from tests.tasks.local_run import _spec
    from workers.training.trainer import Trainer

    cfg, spec = _spec(args, ckpt)
    tr = Trainer(spec)
    tr.init_state(cfg.run.seed)
    tr.compile()
    return (lambda: tr.train_step().loss), tr, spec.plan


def _hard_wired_arm(args: argparse.Namespace, ckpt: str) -> Callable[[], float]:
    """The pre-task path (tests/tasks/local_run.py's verbatim copy), stepped as the old
    ``Trainer.train_step`` did: batch from ``make_rows``, compiled step, three metrics."""
    import functools

    import flax.linen as nn
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tests.tasks import local_run as old
    from workers.training import data as data_lib
    from workers.training.mesh import build_mesh
    from workers.training.model import LOGICAL_RULES, build_model

    cfg, spec = old._spec(args, ckpt)
    mesh = build_mesh(spec.plan)
    model = build_model(cfg.model)
    schedule = old._old_schedule(cfg.train, cfg.run.total_steps)
    tx = old._old_optimizer(cfg.train, cfg.run.total_steps)
    micro = cfg.train.global_batch // args.accum
    shape = (args.accum, micro, cfg.model.seq_len)
    batch_sharding = NamedSharding(mesh, P(None, ("data", "fsdp"), None))
    init_boxed = functools.partial(old._old_init_boxed, model, tx, cfg.model.seq_len)
    abstract = jax.eval_shape(lambda: init_boxed(jax.random.key(0)))
    sharding = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, LOGICAL_RULES)
    init = jax.jit(lambda key: nn.meta.unbox(init_boxed(key)), out_shardings=sharding)
    step_fn = jax.jit(functools.partial(old._old_train_step, model, tx, schedule),
                      in_shardings=(sharding, batch_sharding),
                      out_shardings=(sharding, NamedSharding(mesh, P())), donate_argnums=(0,))
    box = {"state": init(jax.random.key(cfg.run.seed)), "step": 0}
    abstract_state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                  box["state"])
    compiled = step_fn.lower(abstract_state, jax.ShapeDtypeStruct(shape, np.int32)).compile()
    seed, m = cfg.run.seed, cfg.model

    def one() -> float:
        s = box["step"]

        def rows(index):
            a_idx = range(args.accum)[index[0]]
            r_idx = range(micro)[index[1]]
            out = np.stack([data_lib.make_rows(seed, s, range(a * micro + r_idx.start,
                                                              a * micro + r_idx.stop),
                                               seq_len=m.seq_len, vocab_size=m.vocab_size)
                            for a in a_idx])
            return out[:, :, index[2]]

        batch = jax.make_array_from_callback(shape, batch_sharding, rows)
        box["state"], metrics = compiled(box["state"], batch)
        box["step"] = s + 1
        loss, _gnorm, _lr = jax.device_get((metrics["loss"], metrics["grad_norm"],
                                            metrics["lr"]))
        return float(loss)

    return one


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # the device count is fixed before JAX is imported, as in tests/tasks/local_run.py
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    load_start = load_average()
    machine = describe()
    with tempfile.TemporaryDirectory(prefix="bench-task-overhead-") as scratch:
        task_step, trainer, plan = _task_arm(args, os.path.join(scratch, "task"))
        arms = {"task": task_step,
                "hard-wired": _hard_wired_arm(args, os.path.join(scratch, "hard"))}
        losses: dict[str, list[float]] = {a: [] for a in ARMS}
        for arm in ARMS:
            losses[arm] += [arms[arm]() for _ in range(args.warmup)]  # compiled, caches warm
        medians: dict[str, list[float]] = {a: [] for a in ARMS}
        for pair in range(args.pairs):
            order = ARMS if pair % 2 == 0 else ARMS[::-1]
            for arm in order:
                gc.collect()
                times = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    losses[arm].append(arms[arm]())
                    times.append(time.perf_counter() - t0)
                medians[arm].append(statistics.median(times))
        trainer.close()
    load_end = load_average()
    print(_table(args, plan.shape.shape, machine, medians, losses, load_start, load_end))
    return 0


def _table(args: argparse.Namespace, mesh: tuple[int, ...], machine: dict,
           medians: dict[str, list[float]], losses: dict[str, list[float]],
           load_start: list[float] | None, load_end: list[float] | None) -> str:
    ratios = [t / h for t, h in zip(medians["task"], medians["hard-wired"], strict=True)]
    r = spread(ratios)
    start = load_start[0] if load_start else None
    busy = start is None or start >= IDLE_LOAD_1MIN
    same = losses["task"] == losses["hard-wired"]
    lines = [
        "Task API step overhead: Trainer.train_step through the task contract vs the "
        "hard-wired pre-task step (same model, optimizer, loss, batch, mesh, shardings)",
        f"machine: {machine['nproc']} cores ({machine['cpu_model']}), "
        f"{machine['mem_total_gib']} GiB; jax {machine['versions'].get('jax')}",
        f"setup: {args.devices} CPU devices in one process, mesh (data, fsdp, tensor) = {mesh}, "
        f"accum {args.accum}, overrides {' '.join(args.overrides) or '(none: the default lm)'}",
        f"pairs: {args.pairs} × {args.steps} timed steps per arm, interleaved (A B / B A), "
        f"{args.warmup} warm-up steps per arm",
        "",
        "| arm | median step (median of pair medians) | pair medians [min–max] (n) |",
        "|---|---|---|",
    ]
    for arm in ARMS:
        ms = spread([m * 1e3 for m in medians[arm]])
        lines.append(f"| {arm} | {ms['median']:.3f} ms | {fmt_spread(ms, 4, ' ms')} |")
    lines += [
        "",
        f"ratio task / hard-wired, per pair: median {r['median']:.4f} "
        f"[{r['min']:.4f}–{r['max']:.4f}] (n={r['n']})",
        f"losses of the two arms: {'identical' if same else 'DIFFER (not the same computation)'}"
        f" over {len(losses['task'])} steps",
        f"1-minute load: start {start}, end {load_end[0] if load_end else None}"
        + (f"   NOT A RESULT: the 1-minute load at the start was {start} (≥ {IDLE_LOAD_1MIN})"
           if busy else ""),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
