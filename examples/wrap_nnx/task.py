"""``examples/wrap_nnx/model.py`` as a task, the model file unmodified: its ``make_model(seed)``
through ``NnxModel.from_seed`` (the init key is ``jax.random.key(run.seed)``: ``run.seed=S``
gives ``make_model(S)``'s parameters), its ``loss_fn(model, x, y)`` through
``NnxModel.module_loss`` (the orchestrator merges the parameters into the module), its
unannotated layers replicated (docs/tasks.md, "Axis names").

    python -m orchestrator.main --config examples/wrap_nnx/config.yaml
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from examples.wrap_nnx.model import loss_fn, make_model
from orchestrator.shared.errors import ConfigError
from workers.task import Task, TaskContext
from workers.task.nnx import NnxModel
from workers.task.optim import adamw_cosine


@dataclass(frozen=True, kw_only=True)
class ClassifierSettings:
    """``task.*``: the arguments ``make_model`` takes besides its seed."""

    features: int = 16
    hidden: int = 64
    classes: int = 4

    def __post_init__(self) -> None:
        for name in ("features", "hidden", "classes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"task.{name}", f"must be >= 1, got {getattr(self, name)}",
                                  f"set task.{name} to 1 or more")


@dataclass(frozen=True)
class Blobs:
    """Row ``r`` of step ``s``: a class ``y`` and ``x ~ N(centre_y, 1)`` from ``(seed, s, r)``,
    the centres fixed by the seed. A row is the tuple ``(x, y)``: ``loss_fn(model, x, y)``."""

    features: int
    classes: int

    def example(self) -> tuple:
        return (jax.ShapeDtypeStruct((self.features,), jnp.float32),
                jax.ShapeDtypeStruct((), jnp.int32))

    def rows(self, seed: int, step: int, rows: range) -> tuple:
        centres = 2.0 * np.random.default_rng([seed, 11]).normal(size=(self.classes,
                                                                      self.features))
        x = np.empty((len(rows), self.features), np.float32)
        y = np.empty((len(rows),), np.int32)
        for i, r in enumerate(rows):
            rng = np.random.default_rng([seed, step, r])
            y[i] = rng.integers(self.classes)
            x[i] = centres[y[i]] + rng.normal(size=self.features)
        return x, y


def make_task(settings: ClassifierSettings, ctx: TaskContext) -> Task:
    model = NnxModel.from_seed(functools.partial(
        make_model, features=settings.features, hidden=settings.hidden,
        classes=settings.classes))
    tx, schedule = adamw_cosine(ctx)
    return Task(init=model.init, loss=model.module_loss(loss_fn), optimizer=tx,
                schedule=schedule, data=Blobs(settings.features, settings.classes))
