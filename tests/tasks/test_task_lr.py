"""``lr`` in the step metrics is the rate the run trains at (issue 53 item 9): a task without a
schedule is not reported at 0 when it gives its constant rate as ``schedule`` or its optimizer
carries the rate in its state (``optax.inject_hyperparams``). One step of a 4-parameter model on
the CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from orchestrator.shared.errors import ConfigError
from workers.task import Task
from workers.task import state as st


class Rows:
    def example(self):
        return jax.ShapeDtypeStruct((4,), jnp.float32)

    def rows(self, seed, step, rows):
        return np.ones((len(rows), 4), np.float32)


def _task(**kw) -> Task:
    def loss(params, x):
        return jnp.mean((x @ params["w"]) ** 2), {}

    return Task(init=lambda key: {"w": jnp.ones((4,), jnp.float32)}, loss=loss,
                data=Rows(), **{"optimizer": optax.sgd(0.05), **kw})


def _lr(task: Task) -> float:
    state = st.init_unboxed(task, jax.random.key(0))
    _, metrics = st.train_step(task, state, np.ones((1, 2, 4), np.float32))
    return float(metrics["lr"])


def test_a_constant_rate_given_as_the_schedule_is_reported():
    assert _lr(_task(schedule=0.05)) == pytest.approx(0.05)
    with pytest.raises(ConfigError, match="schedule") as err:
        _task(schedule="fast")
    assert "Task(schedule=1e-3)" in err.value.fix


def test_an_optimizers_injected_rate_is_reported_without_a_schedule():
    opt = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    assert _lr(_task(optimizer=opt)) == pytest.approx(1e-3)
    chained = optax.chain(optax.clip_by_global_norm(1.0), opt)  # found inside a chain too
    assert _lr(_task(optimizer=chained)) == pytest.approx(1e-3)
