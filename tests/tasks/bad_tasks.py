"""Task factories that are wrong in one way each, for the driver's task check
(tests/tasks/test_task_check.py). Importable as ``tests.tasks.bad_tasks``."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from workers.task import Task, TaskContext


@dataclass(frozen=True, kw_only=True)
class Settings:
    width: int = 8
    rows_dtype: str = "float32"
    rows_width: int = 4
    narrow_after: int = 0
    tree: bool = False
    """Rows as {"x": the row, "y": two labels}: a tree whose one leaf may differ."""
    """From this step on (0: never) rows are one column narrower: data that goes wrong late."""


class Rows:
    def __init__(self, s: Settings) -> None:
        self.s = s

    def example(self):
        x = jax.ShapeDtypeStruct((4,), jnp.float32)
        return {"x": x, "y": jax.ShapeDtypeStruct((2,), jnp.int32)} if self.s.tree else x

    def rows(self, seed, step, rows):
        late = self.s.narrow_after and step >= self.s.narrow_after
        x = np.zeros((len(rows), self.s.rows_width - (1 if late else 0)), self.s.rows_dtype)
        return {"x": x, "y": np.zeros((len(rows), 2), np.int32)} if self.s.tree else x


def _dense(s: Settings, names) -> nn.Dense:
    init = nn.initializers.lecun_normal()
    return nn.Dense(s.width, use_bias=False,
                    kernel_init=nn.with_logical_partitioning(init, names) if names else init)


def _task(s: Settings, names=(None, "mlp"), loss=None) -> Task:
    dense = _dense(s, names)

    def init(key):
        return dense.init(key, jnp.zeros((1, 4)))["params"]

    def mse(params, x):
        return jnp.mean(dense.apply({"params": params}, x) ** 2), {}

    return Task(init=init, loss=loss or mse, optimizer=optax.sgd(0.1), data=Rows(s))


def good(settings: Settings, ctx: TaskContext) -> Task:
    return _task(settings)


def warns(settings: Settings, ctx: TaskContext) -> Task:
    logging.getLogger(__name__).warning("the task's own warning: settings look odd")
    return _task(settings)


def returns_dict(settings: Settings, ctx: TaskContext) -> dict:
    return {"init": None}


def no_shardings(settings: Settings, ctx: TaskContext) -> Task:
    """Not wrong any more: its unnamed kernel is replicated, said in one line (issue 53)."""
    return _task(settings, names=None)


def unknown_axis(settings: Settings, ctx: TaskContext) -> Task:
    return _task(settings, names=(None, "hidden"))


def indivisible(settings: Settings, ctx: TaskContext) -> Task:
    return _task(settings, names=(None, "fsdp"))  # width 7 over fsdp=2 (the test sets 7)


def loss_breaks(settings: Settings, ctx: TaskContext) -> Task:
    def bad(params, x):
        return jnp.mean(x @ jnp.ones((5, 3))), {}  # x is (micro, 4)

    return _task(settings, loss=bad)


def eval_rows_wrong(settings: Settings, ctx: TaskContext) -> Task:
    """Held-out rows 5 wide where its example() says 4 (tests/tasks/test_eval.py)."""
    return dataclasses.replace(_task(settings), eval_data=Rows(Settings(rows_width=5)))


def not_annotated(settings, ctx):
    return _task(Settings())
