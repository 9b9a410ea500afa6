"""Everything JAX for one process: mesh, model, sharded train state, jitted step, Orbax I/O.

Runs inside a host actor (many processes, one JAX group) and equally in a plain process (one
process, many devices), so the multi-host result can be checked against a single-process run.
The caller (host actor) must have set XLA/device env and called ``jax.distributed.initialize``
before constructing a Trainer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orchestrator.config import RunConfig
from orchestrator.errors import CheckpointError
from orchestrator.plan import MeshPlan
from workers import data as data_lib
from workers.model import LOGICAL_RULES, analytic_flops_per_step, build_model

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def build_mesh(plan: MeshPlan) -> Mesh:
    """Global mesh (data, fsdp, tensor): each axis is DCN (across slices) × ICI (inside one)."""
    s = plan.shape
    ici = (s.ici_data, s.ici_fsdp, s.ici_tensor)
    devices = jax.devices()
    if plan.platform == "tpu":
        from jax.experimental import mesh_utils

        if plan.num_slices > 1:
            arr = mesh_utils.create_hybrid_device_mesh(ici, (s.dcn_data, s.dcn_fsdp, 1), devices)
        else:
            arr = mesh_utils.create_device_mesh(ici, devices)
        return Mesh(arr, AXES)
    # CPU emulation: a process's devices belong to its host's slice; processes are ordered by
    # slice, so slice k owns processes [k·hosts_per_slice, (k+1)·hosts_per_slice).
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    arr = np.array(ordered, dtype=object).reshape(s.dcn_data, s.dcn_fsdp, *ici)
    arr = arr.transpose(0, 2, 1, 3, 4).reshape(s.shape)
    return Mesh(arr, AXES)


def make_optimizer(cfg: RunConfig) -> optax.GradientTransformation:
    t = cfg.train
    return optax.chain(
        optax.clip_by_global_norm(t.grad_clip),
        optax.adamw(make_optimizer_lr(cfg), b1=t.b1, b2=t.b2, weight_decay=t.weight_decay),
    )


@dataclasses.dataclass
class StepOutput:
    step: int
    loss: float
    grad_norm: float
    step_time_s: float
    lr: float


class Trainer:
    """One process's share of the run. Not thread-safe: one caller drives it."""

    def __init__(self, cfg: RunConfig, plan: MeshPlan, *, checkpoint_dir: str,
                 accum_steps: int = 1) -> None:
        self.cfg = cfg
        self.plan = plan
        self.accum_steps = accum_steps
        self.mesh = build_mesh(plan)
        self.model = build_model(cfg.model)
        self.tx = make_optimizer(cfg)
        self.schedule_lr = make_optimizer_lr(cfg)
        self.global_batch = cfg.train.global_batch
        if self.global_batch % accum_steps:
            raise ValueError("global batch must divide by accum_steps")
        self.micro = self.global_batch // accum_steps
        seq = cfg.model.seq_len
        self.batch_shape = (accum_steps, self.micro, seq)
        self.batch_sharding = NamedSharding(self.mesh, P(None, BATCH_AXES, None))
        self.replicated = NamedSharding(self.mesh, P())
        abstract_boxed = jax.eval_shape(self._init_boxed, jax.random.key(0))
        specs = nn.get_partition_spec(abstract_boxed)
        self.state_sharding = nn.logical_to_mesh_sharding(specs, self.mesh, LOGICAL_RULES)
        self.abstract_state = jax.tree.map(
            lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
            nn.meta.unbox(abstract_boxed), self.state_sharding)
        self.n_params = int(sum(math.prod(a.shape) for a in
                                jax.tree.leaves(nn.meta.unbox(abstract_boxed)["params"])))
        self._init = jax.jit(lambda k: nn.meta.unbox(self._init_boxed(k)),
                             out_shardings=self.state_sharding)
        self._step_fn = jax.jit(
            functools.partial(_train_step, self.model, self.tx),
            in_shardings=(self.state_sharding, self.batch_sharding),
            out_shardings=(self.state_sharding, self.replicated),
            donate_argnums=(0,),
        )
        self._compiled = None
        self.flops_xla: float | None = None
        self.flops_analytic = analytic_flops_per_step(cfg.model, self.global_batch)
        self.state: Any = None
        self._host_step: int | None = None
        self.ckpt = _CheckpointIO(checkpoint_dir, cfg)

    # ---- construction -------------------------------------------------------------------

    def _init_boxed(self, key):
        dummy = jnp.zeros((1, self.cfg.model.seq_len - 1), jnp.int32)
        params = self.model.init(key, dummy)["params"]
        return {"params": params, "opt_state": self.tx.init(params),
                "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(key)}

    def compile(self) -> float:
        """Lower and compile the step; returns compile seconds. Records XLA's FLOP count."""
        t0 = time.perf_counter()
        abstract_batch = jax.ShapeDtypeStruct(self.batch_shape, jnp.int32,
                                              sharding=self.batch_sharding)
        lowered = self._step_fn.lower(self.abstract_state, abstract_batch)
        cost = lowered.cost_analysis() or {}
        if isinstance(cost, list):  # older JAX returned one dict per computation
            cost = cost[0] if cost else {}
        self.flops_xla = float(cost.get("flops", 0.0)) or None
        self._compiled = lowered.compile()
        return time.perf_counter() - t0

    def init_state(self, seed: int) -> None:
        self.state = self._init(jax.random.key(seed))
        self._host_step = None

    # ---- data ---------------------------------------------------------------------------

    def batch(self, step: int) -> jax.Array:
        """Global batch for ``step`` built from this process's rows only."""
        m = self.cfg.model
        seed = self.cfg.run.seed
        micro = self.micro

        def rows(index):
            a_idx = range(self.accum_steps)[index[0]]
            r_idx = range(micro)[index[1]]
            out = np.stack([data_lib.make_rows(seed, step, range(a * micro + r_idx.start,
                                                                 a * micro + r_idx.stop),
                                               seq_len=m.seq_len, vocab_size=m.vocab_size)
                            for a in a_idx])
            return out[:, :, index[2]]

        return jax.make_array_from_callback(self.batch_shape, self.batch_sharding, rows)

    # ---- stepping -----------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The state's step, mirrored on the host: reading the device array each step would
        add a device→host sync to every step (measured in bench figure 1)."""
        if self._host_step is None:
            self._host_step = int(jax.device_get(self.state["step"]))
        return self._host_step

    def train_step(self) -> StepOutput:
        if self._compiled is None:
            self.compile()
        step = self.step
        t0 = time.perf_counter()
        batch = self.batch(step)
        self.state, metrics = self._compiled(self.state, batch)
        self._host_step = step + 1
        loss, gnorm = jax.device_get((metrics["loss"], metrics["grad_norm"]))
        dt = time.perf_counter() - t0
        return StepOutput(step=step + 1, loss=float(loss), grad_norm=float(gnorm), step_time_s=dt,
                          lr=float(self.schedule_lr(step)))

    # ---- checkpoints --------------------------------------------------------------------

    def save(self, *, force: bool = False, wait: bool = False, meta: dict | None = None) -> float:
        """Save the current state (async unless ``wait``); returns seconds the step blocked."""
        t0 = time.perf_counter()
        step = self.step
        full_meta = {"step": step, "model": dataclasses.asdict(self.cfg.model),
                     "model_fingerprint": self.cfg.model.fingerprint(),
                     "plan": self.plan.describe(), "config_digest": self.cfg.digest(),
                     **(meta or {})}
        self.ckpt.save(step, self.state, full_meta, force=force)
        if wait:
            self.ckpt.wait()
        return time.perf_counter() - t0

    def restore_latest(self) -> int | None:
        """Restore the newest complete checkpoint into this mesh; returns its step or None."""
        step = self.ckpt.latest_step()
        if step is None:
            return None
        self.state = self.ckpt.restore(step, self.abstract_state)
        self._host_step = None
        return step

    def params_host(self) -> dict:
        """Parameters gathered to host numpy (tests compare runs with it)."""
        from jax.experimental import multihost_utils

        return jax.tree.map(np.asarray,
                            multihost_utils.process_allgather(self.state["params"], tiled=True))

    def close(self) -> None:
        self.ckpt.close()


def make_optimizer_lr(cfg: RunConfig) -> optax.Schedule:
    """Linear warmup to the peak, cosine decay to end_lr_ratio × peak."""
    t = cfg.train
    decay = t.decay_steps or cfg.run.total_steps
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=t.learning_rate, warmup_steps=t.warmup_steps,
        decay_steps=max(decay, t.warmup_steps + 1), end_value=t.learning_rate * t.end_lr_ratio)


def _loss(model, params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    targets = tokens[:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def _train_step(model, tx, state, batch):
    """One optimizer step over ``batch`` (accum, micro, seq); grads averaged over micro-batches."""
    grad_fn = jax.value_and_grad(functools.partial(_loss, model))
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
    return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}


class _CheckpointIO:
    """Orbax CheckpointManager: state (sharded arrays) + a JSON of run metadata per step."""

    def __init__(self, directory: str, cfg: RunConfig) -> None:
        self.directory = Path(directory).absolute()
        self.cfg = cfg
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.checkpoint.keep, create=True,
            enable_async_checkpointing=cfg.checkpoint.async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        self.manager.reload()
        return self.manager.latest_step()

    def save(self, step: int, state, meta: dict, *, force: bool) -> None:
        if step in self.manager.all_steps():
            return
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def read_meta(self, step: int) -> dict:
        args = ocp.args.Composite(meta=ocp.args.JsonRestore())
        return self.manager.restore(step, args=args)["meta"]

    def restore(self, step: int, abstract_state):
        try:
            meta = self.read_meta(step)
        except (KeyError, ValueError, FileNotFoundError) as exc:
            # Not a checkpoint this project wrote (or a damaged one): retrying cannot help.
            raise CheckpointError(
                f"Checkpoint step {step} in {self.directory} has no readable run metadata "
                f"({type(exc).__name__}: {exc}).",
                fix=f"use a new run.run_dir, or move {self.directory / str(step)} away to "
                    "resume from an older step") from None
        want = self.cfg.model.fingerprint()
        if meta.get("model_fingerprint") != want:
            raise CheckpointError(
                f"Checkpoint step {step} in {self.directory} was written by a different model "
                f"({json.dumps(meta.get('model'))}); this run's model is "
                f"{json.dumps(dataclasses.asdict(self.cfg.model))}.",
                fix="use a new run.run_dir, or set model.* to the checkpoint's values")
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state)))
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"Checkpoint step {step} in {self.directory} does not fit this "
                                  f"model: {exc}", fix="use a new run.run_dir") from None
        return out["state"]

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
