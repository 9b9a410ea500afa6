"""A model that names no axes trains (issue 53 item 8): its parameters (and their optimizer
moments) are replicated, the driver's check says so in one line naming how to shard instead,
and a model that names its axes gets the same shardings as before, with no line."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from orchestrator.config import load_config
from orchestrator.driver.task_check import run_check
from workers.task import Task
from workers.task import state as st
from workers.task.nnx import NnxModel


class Plain(nnx.Module):
    """A user's module as written: plain ``nnx.Linear`` layers, no sharding annotations."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


class Rows:
    def example(self):
        return jax.ShapeDtypeStruct((4,), jax.numpy.float32)

    def rows(self, seed, step, rows):
        return np.zeros((len(rows), 4), np.float32)


def _task(model: NnxModel) -> Task:
    return Task(init=model.init, loss=lambda p, b: (model.apply(p, b).mean(), {}),
                optimizer=optax.adamw(1e-3), data=Rows())


def _specs(task: Task):
    boxed = jax.eval_shape(lambda: st.init_boxed(task, jax.random.key(0)))
    return st.state_specs(task, boxed)


def test_an_unannotated_nnx_module_is_replicated_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv(st.NOTES_ENV, "1")
    specs = _specs(_task(NnxModel(Plain)))
    params = specs["params"]
    assert params["hidden"]["kernel"] == P() and params["out"]["bias"] == P()
    moments = [s for s in jax.tree.leaves(specs["opt_state"], is_leaf=lambda x: isinstance(x, P))
               if isinstance(s, P)]
    assert moments and all(s == P() for s in moments)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(st.NOTE_MARKER)]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "4 parameter array(s) (67 values) have no axis names and are replicated" in line
    assert "['hidden']['kernel'] (4, 8)" in line and "nnx.with_partitioning" in line


def test_hosts_stay_silent_without_the_drivers_request(monkeypatch, capsys):
    monkeypatch.delenv(st.NOTES_ENV, raising=False)
    _specs(_task(NnxModel(Plain)))
    assert st.NOTE_MARKER not in capsys.readouterr().out


def test_an_annotated_module_keeps_its_shardings_and_prints_nothing(monkeypatch, capsys):
    from examples.my_task.task import MLP, MLPSettings

    monkeypatch.setenv(st.NOTES_ENV, "1")
    task = _task(NnxModel(lambda rngs: MLP(MLPSettings(features=4), rngs)))
    specs = _specs(task)["params"]
    assert specs["layers"][0]["kernel"] == P("fsdp", "tensor")
    assert specs["layers"][1]["kernel"] == P(None, "tensor")
    assert specs["head"]["kernel"] == P("tensor", None)
    assert st.NOTE_MARKER not in capsys.readouterr().out


def test_named_but_wrong_axes_are_still_refused():
    from orchestrator.shared.errors import ConfigError

    class Wrong(nnx.Module):
        def __init__(self, rngs):
            self.k = nnx.Param(nn.initializers.ones(rngs.params(), (2, 3)), out_sharding=("x",))

    with pytest.raises(ConfigError, match="do not match the dimensions"):
        _specs(_task(NnxModel(Wrong)))


def test_the_drivers_check_passes_an_unnamed_task_and_carries_the_line():
    """The real check subprocess (``python -m workers.task.check``): the line reaches the
    driver, which prints it once (``check_task``)."""
    summary = run_check(load_config(None, ["task.kind=tests.tasks.bad_tasks:no_shardings"]))
    assert len(summary.notes) == 1, summary.notes
    assert "have no axis names and are replicated on every device" in summary.notes[0]
    assert "['kernel'] (4, 8)" in summary.notes[0]
