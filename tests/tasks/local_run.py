"""Train in ONE plain process with D CPU devices (no Ray): the Trainer through the task contract,
and for the built-in LM also a copy of the path that was hard-wired before tasks existed.

``python -m tests.tasks.local_run --devices 4 --steps N --out F.npz [--accum A] [--reference]
[k=v ...]`` in a subprocess (the device count is fixed there, never in pytest's process). Writes
the per-step losses, the task's extra metrics and the final parameters (``param:a/b/c``) to
``F.npz``; ``--reference`` also writes the old path's to ``F.reference.npz`` and prints both
steps' optimized HLO digests as one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import sys
import tempfile

import numpy as np


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--store", default=None, help="an executable store to load from / fill")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    info = run_task(args)
    if args.reference:
        info["reference_hlo"] = run_reference(args)
    print(json.dumps(info), flush=True)
    return 0


def _spec(args: argparse.Namespace, ckpt: str):
    from orchestrator.config import load_config
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import MeshPlan

    cfg = load_config(None, args.overrides)
    shape = cfg.validate_for(slices=1, hosts_per_slice=1, devices_per_host=args.devices)
    host = HostRef(index=0, slice_name="local", worker_id=0, node_id="local",
                   node_ip="127.0.0.1", instance="local", devices=args.devices)
    plan = MeshPlan(hosts=(host,), slice_names=("local",), shape=shape,
                    devices_per_host=args.devices, platform="cpu")
    return cfg, HostSpec.for_host(cfg, plan, host, checkpoint_dir=ckpt, accum_steps=args.accum,
                                  executables_dir=getattr(args, "store", None))


def run_task(args: argparse.Namespace) -> dict:
    from tests.integration.single_process import flatten
    from workers.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as ckpt:
        cfg, spec = _spec(args, ckpt)
        tr = Trainer(spec)
        tr.init_state(cfg.run.seed)
        tr.compile()
        outs = [tr.train_step() for _ in range(args.steps)]
        params = flatten(tr.params_host())
        tr.close()
    extra = {k: np.asarray([o.extra[k] for o in outs]) for k in (outs[0].extra if outs else {})}
    np.savez(args.out, **{f"param:{k}": v for k, v in params.items()},
             **{f"extra:{k}": v for k, v in extra.items()},
             losses=np.asarray([o.loss for o in outs], np.float64))
    return {"hlo": _hlo_digest(tr._compiled), "flops_analytic": tr.flops_analytic,
            "flops_xla": tr.flops_xla, "tokens_per_step": tr.tokens_per_step,
            "fingerprint": tr.resolved.fingerprint,
            "compile": {"source": tr.compile_info.source, "key": tr.compile_info.key,
                        "reason": tr.compile_info.reason}}


def _hlo_digest(compiled) -> str:
    """The optimized HLO without names and source locations (metadata, the stack frame tables,
    names derived from the jitted function's): the computation itself."""
    text = compiled.as_text()
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r", stack_frame_id=\d+", "", text)
    text = re.sub(r"^(\d+ .*|FileNames|FunctionNames|FileLocations|StackFrames)\n", "", text,
                  flags=re.M)
    text = re.sub(r"^HloModule \S+", "HloModule m", text, flags=re.M)
    text = re.sub(r"jit_\w*?train_step_", "jit_step_", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- the path that was hard-wired before tasks (kept verbatim as the reference) --------------

def run_reference(args: argparse.Namespace) -> str:
    import flax.linen as nn
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tests.integration.single_process import flatten
    from workers.training import data as data_lib
    from workers.training.mesh import build_mesh
    from workers.training.model import LOGICAL_RULES, build_model

    with tempfile.TemporaryDirectory() as ckpt:
        cfg, spec = _spec(args, ckpt)
    mesh = build_mesh(spec.plan)
    model = build_model(cfg.model)
    schedule = _old_schedule(cfg.train, cfg.run.total_steps)
    tx = _old_optimizer(cfg.train, cfg.run.total_steps)
    micro = cfg.train.global_batch // args.accum
    shape = (args.accum, micro, cfg.model.seq_len)
    batch_sharding = NamedSharding(mesh, P(None, ("data", "fsdp"), None))
    init_boxed = functools.partial(_old_init_boxed, model, tx, cfg.model.seq_len)
    abstract = jax.eval_shape(lambda: init_boxed(jax.random.key(0)))
    sharding = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, LOGICAL_RULES)
    init = jax.jit(lambda key: nn.meta.unbox(init_boxed(key)), out_shardings=sharding)
    step = jax.jit(functools.partial(_old_train_step, model, tx, schedule),
                   in_shardings=(sharding, batch_sharding),
                   out_shardings=(sharding, NamedSharding(mesh, P())), donate_argnums=(0,))
    state = init(jax.random.key(cfg.run.seed))
    abstract_state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    compiled = step.lower(abstract_state, jax.ShapeDtypeStruct(shape, np.int32)).compile()
    losses = []
    for s in range(args.steps):
        def rows(index, s=s):
            a_idx, r_idx = range(args.accum)[index[0]], range(micro)[index[1]]
            out = np.stack([data_lib.make_rows(cfg.run.seed, s, range(
                a * micro + r_idx.start, a * micro + r_idx.stop), seq_len=cfg.model.seq_len,
                vocab_size=cfg.model.vocab_size) for a in a_idx])
            return out[:, :, index[2]]

        batch = jax.make_array_from_callback(shape, batch_sharding, rows)
        state, metrics = compiled(state, batch)
        losses.append(float(metrics["loss"]))
    from jax.experimental import multihost_utils

    params = flatten(jax.tree.map(np.asarray, multihost_utils.process_allgather(
        state["params"], tiled=True)))
    np.savez(args.out.removesuffix(".npz") + ".reference.npz",
             **{f"param:{k}": v for k, v in params.items()},
             losses=np.asarray(losses, np.float64))
    return _hlo_digest(compiled)


def _old_schedule(t, total_steps):
    import optax

    decay = t.decay_steps or total_steps
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=t.learning_rate, warmup_steps=t.warmup_steps,
        decay_steps=max(decay, t.warmup_steps + 1), end_value=t.learning_rate * t.end_lr_ratio)


def _old_optimizer(train, total_steps):
    import optax

    return optax.chain(
        optax.clip_by_global_norm(train.grad_clip),
        optax.adamw(_old_schedule(train, total_steps), b1=train.b1, b2=train.b2,
                    weight_decay=train.weight_decay),
    )


def _old_init_boxed(model, tx, seq_len, key):
    import jax
    import jax.numpy as jnp

    dummy = jnp.zeros((1, seq_len - 1), jnp.int32)
    params = model.init(key, dummy)["params"]
    return {"params": params, "opt_state": tx.init(params),
            "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(key)}


def _old_loss(model, params, tokens):
    import optax

    logits = model.apply({"params": params}, tokens[:, :-1])
    targets = tokens[:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def _old_train_step(model, tx, schedule, state, batch):
    import jax
    import jax.numpy as jnp
    import optax

    grad_fn = jax.value_and_grad(functools.partial(_old_loss, model))
    if batch.shape[0] == 1:
        loss, grads = grad_fn(state["params"], batch[0])
    else:
        def body(carry, tokens):
            loss_sum, grad_sum = carry
            loss, grads = grad_fn(state["params"], tokens)
            return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, state["params"])
        (loss, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), batch)
        n = batch.shape[0]
        loss, grads = loss / n, jax.tree.map(lambda g: g / n, grads)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1,
                 "rng": state["rng"]}
    return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads),
                       "lr": schedule(state["step"])}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
