"""A task's own code is part of its executable's key: a user's module compiled and stored, then
its loss edited, never loads the stale step (the key's ``task_code`` changes and the log says
so); unchanged, it loads. Single process, a store in a temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

V1 = textwrap.dedent('''
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


    class Rows:
        def example(self):
            return jax.ShapeDtypeStruct((4,), jnp.float32)

        def rows(self, seed, step, rows):
            return np.stack([np.random.default_rng([seed, step, r]).normal(size=4)
                             for r in rows]).astype(np.float32).reshape(len(rows), 4)


    def make_task(settings: Settings, ctx: TaskContext) -> Task:
        dense = nn.Dense(settings.width, kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), (None, "mlp")), use_bias=False)

        def init(key):
            return dense.init(key, jnp.zeros((1, 4)))["params"]

        def loss(params, x):
            y = dense.apply({"params": params}, x)
            return LOSS, {}

        return Task(init=init, loss=loss, optimizer=optax.sgd(0.1), data=Rows())
''')


def _run(tmp_path, store) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices", "2",
                           "--steps", "2", "--out", str(tmp_path / "out.npz"), "--store",
                           str(store), "task.kind=kv_task.task:make_task",
                           "train.global_batch=4", "run.total_steps=4"],
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_editing_the_task_loss_changes_the_key_and_recompiles(tmp_path):
    pkg = tmp_path / "kv_task"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    module = pkg / "task.py"
    store = tmp_path / "store"
    module.write_text(V1.replace("LOSS", "jnp.mean(y**2)"))
    first = _run(tmp_path, store)
    assert first["compile"]["source"] == "compiled"
    again = _run(tmp_path, store)
    assert again["compile"] == {**first["compile"], "source": "loaded", "reason": ""}

    module.write_text(V1.replace("LOSS", "jnp.mean(jnp.abs(y))"))  # v2: another loss
    edited = _run(tmp_path, store)
    assert edited["compile"]["source"] == "compiled"
    assert edited["compile"]["key"] != first["compile"]["key"]
    assert "config.task_code" in edited["compile"]["reason"], edited["compile"]["reason"]
