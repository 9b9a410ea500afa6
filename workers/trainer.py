"""Everything JAX for one process: mesh, model, sharded train state, jitted step, Orbax I/O.

Runs inside a host actor (many processes, one JAX group) and equally in a plain process (one
process, many devices), so the multi-host result can be checked against a single-process run.
The caller (host actor) must have set XLA/device env and called ``jax.distributed.initialize``
before constructing a Trainer. Orbax I/O lives in ``workers.checkpoints``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Collection
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orchestrator.config import ModelConfig, TrainConfig
from orchestrator.hostspec import HostSpec
from orchestrator.plan import MeshPlan
from workers import data as data_lib
from workers.checkpoints import CheckpointStore, RestoreOutcome
from workers.compile_share import CompileInfo, obtain, share_for
from workers.executables import (
    ExecutableStore,
    executable_key,
    mesh_ingredients,
    runtime_ingredients,
)
from workers.model import LOGICAL_RULES, analytic_flops_per_step, build_model

log = logging.getLogger(__name__)

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def build_mesh(plan: MeshPlan, devices: list | None = None) -> Mesh:
    """Mesh (data, fsdp, tensor) over ``devices`` (default all): axes are DCN × ICI."""
    s = plan.shape
    ici = (s.ici_data, s.ici_fsdp, s.ici_tensor)
    devices = jax.devices() if devices is None else devices
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


def make_optimizer(train: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(train.grad_clip),
        optax.adamw(make_lr_schedule(train, total_steps), b1=train.b1, b2=train.b2,
                    weight_decay=train.weight_decay),
    )


@dataclasses.dataclass(frozen=True)
class SaveOutput:
    step: int
    started: bool
    """False when this step was already saved or being saved."""
    blocking_s: float
    """Seconds the caller was blocked (the async part runs on in Orbax's thread)."""


@dataclasses.dataclass
class StepOutput:
    step: int
    loss: float
    grad_norm: float
    step_time_s: float
    lr: float


class Trainer:
    """One process's share of the run. Not thread-safe: one caller drives it (``step`` may be
    read from other threads: it is a plain int on the host)."""

    def __init__(self, spec: HostSpec, *, before_commit: Callable[[], None] | None = None,
                 devices: list | None = None) -> None:
        """``before_commit``: see ``CheckpointStore`` (tests hold a save in flight with it).
        ``devices``: build the mesh over these only (``workers.host_ahead``)."""
        self.spec = spec
        self.plan = spec.plan
        self.accum_steps = spec.accum_steps
        self.mesh = build_mesh(spec.plan, devices)
        self.model = build_model(spec.model)
        self.schedule_lr = make_lr_schedule(spec.train, spec.total_steps)
        self.tx = make_optimizer(spec.train, spec.total_steps)
        self.global_batch = spec.train.global_batch
        self.micro = self.global_batch // spec.accum_steps
        self.batch_shape = (spec.accum_steps, self.micro, spec.model.seq_len)
        self.batch_sharding = NamedSharding(self.mesh, P(None, BATCH_AXES, None))
        self.replicated = NamedSharding(self.mesh, P())
        # no lambda over ``self`` kept on ``self``: that cycle kept the arrays alive after the
        # trainer was dropped, until a full collection (``host_warm`` needs them gone at once)
        init_boxed = functools.partial(_init_boxed, self.model, self.tx, spec.model.seq_len)
        abstract_boxed = abstract_boxed_state(spec.model, spec.train, spec.total_steps)
        specs = nn.get_partition_spec(abstract_boxed)
        self.state_sharding = nn.logical_to_mesh_sharding(specs, self.mesh, LOGICAL_RULES)
        self.abstract_state = jax.tree.map(
            lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
            nn.meta.unbox(abstract_boxed), self.state_sharding)
        self.n_params = int(sum(math.prod(a.shape) for a in
                                jax.tree.leaves(nn.meta.unbox(abstract_boxed)["params"])))
        self._init = jax.jit(functools.partial(_init_unboxed, init_boxed),
                             out_shardings=self.state_sharding)
        self._step_fn = jax.jit(
            functools.partial(_train_step, self.model, self.tx, self.schedule_lr),
            in_shardings=(self.state_sharding, self.batch_sharding),
            out_shardings=(self.state_sharding, self.replicated),
            donate_argnums=(0,),
        )
        self._compiled = None
        self._init_compiled = None
        self.executables = (ExecutableStore(spec.executables_dir, key_file=spec.executables_key)
                            if spec.executables_dir else None)
        self._key_parts: tuple[dict, dict] | None = None
        self.share = share_for(list(self.mesh.devices.flat), platform=spec.plan.platform,
                               enabled=spec.share_compile, store=self.executables is not None,
                               wait_s=spec.share_wait_s)
        self.compile_info: CompileInfo | None = None
        self.init_info: CompileInfo | None = None
        self.flops_xla: float | None = None
        self.flops_analytic = analytic_flops_per_step(spec.model, self.global_batch)
        self.state: Any = None
        self._host_step: int | None = None
        self.ckpt = CheckpointStore(
            spec.checkpoint_dir, keep=spec.checkpoint.keep, async_save=spec.checkpoint.async_save,
            model_fingerprint=spec.model.fingerprint(),
            model_desc=json.dumps(dataclasses.asdict(spec.model)), before_commit=before_commit)

    # ---- construction -------------------------------------------------------------------

    def compile(self) -> float:
        """Load the step's executable from the store, or lower and compile it; returns the
        seconds it took (``compile_info`` says which). Records XLA's FLOP count."""
        t0 = time.perf_counter()
        abstract_batch = jax.ShapeDtypeStruct(self.batch_shape, jnp.int32,
                                              sharding=self.batch_sharding)
        self._compiled, self.compile_info = self._executable(
            "train_step", self._step_fn, (self.abstract_state, abstract_batch), cost=True)
        self.flops_xla = self.compile_info.flops
        return time.perf_counter() - t0

    def init_state(self, seed: int) -> None:
        if self._init_compiled is None:
            abstract_key = jax.eval_shape(lambda: jax.random.key(0))
            self._init_compiled, self.init_info = self._executable("init", self._init,
                                                                   (abstract_key,))
        self.state = self._init_compiled(jax.random.key(seed))
        self._host_step = None

    # ---- executables --------------------------------------------------------------------

    def _executable(self, function: str, jitted: Any, args: tuple, *, cost: bool = False
                    ) -> tuple[Any, CompileInfo]:
        """``function``'s executable: loaded, compiled, or the owner's (``compile_share``)."""
        key, reason = None, "executable store off (compile.cache=off)"
        if self.executables is not None:
            try:
                key = self.executable_key(function)
            except Exception as exc:  # an optimisation: compile as if there were no store
                reason = f"no key ({type(exc).__name__}: {exc})"
                log.warning("executable key for %s unavailable: %s", function, reason)
        return obtain(function, jitted, args, store=self.executables, key=key,
                      devices=self.mesh.devices.flat, cost=cost, share=self.share,
                      no_key_reason=reason)

    def executable_key(self, function: str) -> dict:
        """The store key of this process's executable of ``function`` (workers/executables)."""
        if self._key_parts is None:
            self._key_parts = (runtime_ingredients(), mesh_ingredients(
                self.mesh, self.plan.shape.as_dict(), num_slices=self.plan.num_slices))
        runtime, mesh = self._key_parts
        config = {"model": dataclasses.asdict(self.spec.model),
                  "train": dataclasses.asdict(self.spec.train),
                  "total_steps": self.spec.total_steps, "accum_steps": self.accum_steps}
        count = len({d.process_index for d in self.mesh.devices.flat})  # a prefix if ahead
        index = self.share.owner if self.share is not None else jax.process_index()
        return executable_key(function=function, runtime=runtime, config=config, mesh=mesh,
                              process_index=index, process_count=count)

    # ---- data ---------------------------------------------------------------------------

    def batch(self, step: int) -> jax.Array:
        """Global batch for ``step`` built from this process's rows only."""
        m = self.spec.model
        seed = self.spec.seed
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
        # one device->host copy; the LR comes from the jitted step (no eager op: ~0.3 s once)
        loss, gnorm, lr = jax.device_get((metrics["loss"], metrics["grad_norm"], metrics["lr"]))
        dt = time.perf_counter() - t0
        return StepOutput(step=step + 1, loss=float(loss), grad_norm=float(gnorm), step_time_s=dt,
                          lr=float(lr))

    # ---- checkpoints --------------------------------------------------------------------

    def save(self, *, wait: bool = False) -> SaveOutput:
        """Save the current step (async unless ``wait``).

        A step already saved or being saved is not saved twice (``wait`` still waits for it).
        """
        t0 = time.perf_counter()
        step = self.step
        meta = {"step": step, "model": dataclasses.asdict(self.spec.model),
                "model_fingerprint": self.spec.model.fingerprint(),
                "plan": self.plan.describe(), "config_digest": self.spec.config_digest}
        started = self.ckpt.save(step, self.state, meta)
        if wait:
            self.ckpt.wait()
        return SaveOutput(step=step, started=started, blocking_s=time.perf_counter() - t0)

    def restore(self, skip_steps: Collection[int] = ()) -> RestoreOutcome:
        """Restore the newest usable committed step (see ``CheckpointStore.restore``), or
        initialise from the seed when there is none."""
        out = self.ckpt.restore(self.abstract_state, skip_steps=skip_steps,
                                process_index=jax.process_index(),
                                process_count=jax.process_count())
        if out.step is None:
            self.init_state(self.spec.seed)
        else:
            self.state = out.state
            out.state = None
            self._host_step = None
        return out

    def restore_from_copies(self, step: int, copies: list[tuple[dict, bytes]]) -> None:
        """Take the state of ``step`` from RAM copies (``workers.replica``), in this mesh."""
        from workers.replica import ReplicaMismatch, unpack

        state = unpack(copies, self.abstract_state)
        found = int(jax.device_get(state["step"]))
        if found != step:
            raise ReplicaMismatch(f"the copies hold step {found}, not {step}")
        self.state = state
        self._host_step = found

    def params_host(self) -> dict:
        """Parameters gathered to host numpy (tests compare runs with it)."""
        from jax.experimental import multihost_utils

        return jax.tree.map(np.asarray,
                            multihost_utils.process_allgather(self.state["params"], tiled=True))

    def close(self) -> None:
        self.ckpt.close()


@functools.lru_cache(maxsize=4)
def abstract_boxed_state(model: ModelConfig, train: TrainConfig, total_steps: int) -> Any:
    """The state's shapes, dtypes and partitioning, uncomputed. Tracing the init takes ~0.1 s:
    a process joining several groups (or a standby told the model, ``WarmMethods.warm``) does
    it once. Depends only on these configs (no mesh or backend): valid across re-forms."""
    init = functools.partial(_init_boxed, build_model(model), make_optimizer(train, total_steps),
                             model.seq_len)
    return jax.eval_shape(lambda: init(jax.random.key(0)))  # traced: no key computed


def _init_boxed(model, tx, seq_len: int, key):
    dummy = jnp.zeros((1, seq_len - 1), jnp.int32)
    params = model.init(key, dummy)["params"]
    return {"params": params, "opt_state": tx.init(params),
            "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(key)}


def _init_unboxed(init_boxed, key):
    return nn.meta.unbox(init_boxed(key))


def make_lr_schedule(t: TrainConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup to the peak, cosine decay to end_lr_ratio × peak."""
    decay = t.decay_steps or total_steps
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=t.learning_rate, warmup_steps=t.warmup_steps,
        decay_steps=max(decay, t.warmup_steps + 1), end_value=t.learning_rate * t.end_lr_ratio)


def _loss(model, params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    targets = tokens[:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def _train_step(model, tx, schedule, state, batch):
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
    return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads),
                       "lr": schedule(state["step"])}
