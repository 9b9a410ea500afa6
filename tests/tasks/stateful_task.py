"""A task whose data is *stateful*: a stream read in order, whose position is a cursor of its
own (what a streaming source would keep), for the data-position tests
(tests/tasks/test_data_position.py). Its state must travel with every tier and come back on a
restore; a resize refuses unless ``reshardable``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from workers.task import Task, TaskContext


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    features: int = 4
    reshardable: bool = False


class CountingStream:
    """Rows are the stream's next ones; ``cursor`` counts the rows this process has read."""

    reshard_reason = "each process's cursor counts its own part of the stream"

    def __init__(self, features: int, reshardable: bool) -> None:
        self.features, self.reshardable, self.cursor = features, reshardable, 0
        self.restored: list[Any] = []

    def example(self) -> Any:
        return {"x": jax.ShapeDtypeStruct((self.features,), jnp.float32)}

    def rows(self, seed: int, step: int, rows: range) -> Any:
        start, self.cursor = self.cursor, self.cursor + len(rows)
        x = np.arange(start, self.cursor, dtype=np.float32)[:, None] + np.zeros(self.features)
        return {"x": (x % 7).astype(np.float32)}

    def state(self) -> dict:
        return {"cursor": self.cursor}

    def set_state(self, states: list, *, process_index: int, process_count: int) -> None:
        self.restored.append([dict(s) for s in states])
        if len(states) == process_count:
            self.cursor = int(states[process_index]["cursor"])
        else:  # re-cut: the rows read so far, shared out again
            self.cursor = sum(int(s["cursor"]) for s in states) // process_count


def make_task(settings: StreamSettings, ctx: TaskContext) -> Task:
    def init(key):
        w = jax.random.normal(key, (settings.features,), jnp.float32)
        return {"w": nn.Partitioned(w, names=(None,))}

    def loss(params, batch):
        return jnp.mean((batch["x"] @ params["w"] - 1.0) ** 2), {}

    return Task(init=init, loss=loss, optimizer=optax.sgd(0.01),
                data=CountingStream(settings.features, settings.reshardable))
