"""An NNX model that exists wraps unmodified (issue 53 item 9): ``make_model(seed)`` through
``NnxModel.from_seed`` gives, for init key ``jax.random.key(S)`` (what ``run.seed=S`` passes),
the parameters ``make_model(S)`` gives; ``module_loss`` turns ``loss_fn(model, x, y)`` into the
contract's loss; and the example (examples/wrap_nnx: the model file as written) trains a step
on a 2-device CPU mesh in one process (no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from examples.wrap_nnx.model import loss_fn, make_model
from workers.task.nnx import NnxModel

ROOT = Path(__file__).resolve().parents[2]


def _values(params) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(params)}


def test_the_init_key_of_run_seed_gives_make_models_own_parameters():
    model = NnxModel.from_seed(make_model)
    got = _values(model.init(jax.random.key(3)))
    want = _values(nnx.to_pure_dict(nnx.state(make_model(3), nnx.Param)))
    assert sorted(got) == sorted(want) == ["['hidden']['bias']", "['hidden']['kernel']",
                                           "['out']['bias']", "['out']['kernel']"]
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    other = _values(model.init(jax.random.key(4)))
    assert not np.array_equal(other["['hidden']['kernel']"], want["['hidden']['kernel']"])


def test_module_loss_merges_the_parameters_and_calls_the_users_loss():
    model = NnxModel.from_seed(make_model)
    params = model.init(jax.random.key(0))
    x = np.ones((5, 16), np.float32)
    y = np.arange(5, dtype=np.int32) % 4
    loss, metrics = model.module_loss(loss_fn)(params, (x, y))
    assert metrics == {}  # loss_fn's aux (the logits) is not a metric
    np.testing.assert_allclose(loss, loss_fn(make_model(0), x, y)[0], rtol=1e-6)

    def with_metrics(m, x, y):
        logits = m(x)
        return logits.mean(), {"top": jnp.max(logits)}

    loss, metrics = model.module_loss(with_metrics)(params, {"x": x, "y": y})
    assert sorted(metrics) == ["top"]
    assert model.module_loss(lambda m, b: m(b).sum())(params, x)[1] == {}


def test_the_example_trains_a_step_on_a_cpu_mesh_without_ray(tmp_path):
    out = tmp_path / "wrap.npz"
    done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices", "2",
                           "--steps", "3", "--out", str(out),
                           "task.kind=examples.wrap_nnx.task:make_task", "run.total_steps=3",
                           "train.global_batch=8", "compile.cache=off"],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    json.loads(done.stdout.strip().splitlines()[-1])
    got = np.load(out)
    assert got["losses"].shape == (3,) and np.all(np.isfinite(got["losses"]))
    trained = got["param:hidden/kernel"]
    initial = np.asarray(nnx.state(make_model(0), nnx.Param)["hidden"]["kernel"].get_value())
    assert trained.shape == (16, 64) and not np.array_equal(trained, initial)


def test_the_drivers_check_passes_the_example_saying_its_layers_are_replicated():
    """The driver prints the replication line, and counts the classifier's rows as examples."""
    from orchestrator.config import load_config
    from orchestrator.driver.task_check import run_check
    from orchestrator.metrics.console import throughput_unit

    summary = run_check(load_config(str(ROOT / "examples" / "wrap_nnx" / "config.yaml")))
    assert summary.n_params == 16 * 64 + 64 + 64 * 4 + 4
    assert len(summary.notes) == 1 and "replicated on every device" in summary.notes[0]
    assert throughput_unit(summary.tokens_per_step, 32) == "examples"  # the console: examples/s
