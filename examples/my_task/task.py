"""An example task from outside the orchestrator: a Flax NNX MLP learning a fixed smooth
function of its input, on data that is a pure function of (seed, step, row).

Run it with ``python -m orchestrator.main --config examples/my_task/config.yaml``; the config
names ``task.kind: examples.my_task.task:make_task`` and this task's settings (``MLPSettings``)
beside it: ``task.hidden``, ``task.depth``, ``task.features``.
Everything a run guarantees (checkpoint tiers, re-forms, resizes, executables, MFU) holds for it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchestrator.shared.errors import ConfigError
from workers.task import Task, TaskContext
from workers.task.nnx import NnxModel
from workers.task.optim import adamw_cosine


@dataclass(frozen=True, kw_only=True)
class MLPSettings:
    """This task's settings, ``task.<name>`` (validated like every config section)."""

    features: int = 8
    hidden: int = 64
    depth: int = 2

    def __post_init__(self) -> None:
        for name in ("features", "hidden", "depth"):
            if getattr(self, name) < 1:
                raise ConfigError(f"task.{name}",
                                  f"must be >= 1, got {getattr(self, name)}",
                                  f"set task.{name} to 1 or more")


class MLP(nnx.Module):
    """``depth`` hidden layers; kernels sharded by logical axis names (``embed`` over fsdp,
    ``mlp`` over tensor: the default rules)."""

    def __init__(self, s: MLPSettings, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.lecun_normal()
        dims = [s.features] + [s.hidden] * s.depth
        self.layers = nnx.List([
            nnx.Linear(a, b, rngs=rngs,
                       kernel_init=nnx.with_partitioning(init, ("embed" if i == 0 else None,
                                                                "mlp")),
                       bias_init=nnx.with_partitioning(nnx.initializers.zeros, ("mlp",)))
            for i, (a, b) in enumerate(itertools.pairwise(dims))])
        self.head = nnx.Linear(s.hidden, 1, rngs=rngs,
                               kernel_init=nnx.with_partitioning(init, ("mlp", None)),
                               bias_init=nnx.with_partitioning(nnx.initializers.zeros, (None,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = nnx.gelu(layer(x))
        return self.head(x)[..., 0]


@dataclass(frozen=True)
class Regression:
    """Row ``r`` of step ``s``: ``x ~ N(0, 1)^features`` from ``(seed, s, r)``, and the target
    ``y = sin(x · a) + 0.5 · cos(x · b)`` with ``a``, ``b`` fixed by the seed."""

    features: int
    held_out: bool = False
    """True: rows from another seed stream (a spawn key of ``(seed, s, r)``'s), none of which a
    training step draws: the eval split."""

    def example(self) -> dict:
        return {"x": jax.ShapeDtypeStruct((self.features,), jnp.float32),
                "y": jax.ShapeDtypeStruct((), jnp.float32)}

    def rows(self, seed: int, step: int, rows: range) -> dict:
        w = np.random.default_rng([seed, 7]).normal(size=(2, self.features)) / np.sqrt(
            self.features)
        x = np.stack([np.random.default_rng(self._seed(seed, step, r)).normal(size=self.features)
                      for r in rows]).astype(np.float32).reshape(len(rows), self.features)
        y = np.sin(x @ w[0]) + 0.5 * np.cos(x @ w[1])
        return {"x": x, "y": y.astype(np.float32)}

    def _seed(self, seed: int, step: int, row: int):
        if self.held_out:
            return np.random.SeedSequence([seed, step, row], spawn_key=(1,))
        return [seed, step, row]


def make_task(settings: MLPSettings, ctx: TaskContext) -> Task:
    model = NnxModel(lambda rngs: MLP(settings, rngs))
    tx, schedule = adamw_cosine(ctx)  # AdamW + warmup/cosine from train.*

    def loss(params, batch):
        err = model.apply(params, batch["x"]) - batch["y"]
        return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}

    def eval_step(params, batch):  # on held-out rows; every metric a mean over its rows
        err = model.apply(params, batch["x"]) - batch["y"]
        return {"loss": jnp.mean(err**2), "mae": jnp.mean(jnp.abs(err)),
                "within_0_1": jnp.mean((jnp.abs(err) < 0.1).astype(jnp.float32))}

    matmul = settings.features * settings.hidden + (settings.depth - 1) * settings.hidden**2
    return Task(init=model.init, loss=loss, optimizer=tx, schedule=schedule,
                data=Regression(settings.features),
                eval_data=Regression(settings.features, held_out=True), eval_step=eval_step,
                flops_per_step=6.0 * ctx.train.global_batch * (matmul + settings.hidden))
