"""The orchestrator's side of a task: the train state around its parameters, the state's
shardings from the parameters' axis names, the jitted step (the task's loss with gradient
accumulation and its optimizer, or the task's own step), and the checks that a task's state
and batch fit the mesh (driver check and hosts alike).

The state is ``{"params", "opt_state", "step", "rng"}``: ``step`` is the data position (the
batch of step ``s`` is a pure function of ``(seed, s)``), so a state restored from any tier
continues the same sample order.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from orchestrator.shared.errors import ConfigError
from workers.task.contract import Task

BATCH_AXES = ("data", "fsdp")
RESERVED_METRICS = ("loss", "grad_norm", "lr")


def init_boxed(task: Task, key):
    """The state with the parameters' (and optimizer moments') axis metadata still boxed."""
    params = task.init(key)
    return {"params": params, "opt_state": task.optimizer.init(params),
            "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(key)}


def init_unboxed(task: Task, key):
    return nn.meta.unbox(init_boxed(task, key))


def train_step(task: Task, state, batch):
    """One optimizer step over ``batch`` (leaves ``(accum, micro, ...)``): the task's own step,
    or its loss with gradients averaged over the micro-batches."""
    if task.step is not None:
        new_state, metrics = task.step(state, batch)
        metrics = dict(metrics)
        metrics.setdefault("grad_norm", jnp.zeros((), jnp.float32))
        metrics.setdefault("lr", _lr(task, state))
        return new_state, metrics
    grad_fn = jax.value_and_grad(task.loss, has_aux=True)
    if jax.tree.leaves(batch)[0].shape[0] == 1:
        (loss, aux), grads = grad_fn(state["params"], jax.tree.map(lambda x: x[0], batch))
    else:
        def body(carry, micro):
            loss_sum, grad_sum, aux_sum = carry
            (loss, aux), grads = grad_fn(state["params"], micro)
            return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads),
                    jax.tree.map(jnp.add, aux_sum, aux)), None

        zeros = jax.tree.map(jnp.zeros_like, state["params"])
        first = jax.tree.map(lambda x: x[0], batch)
        aux_shape = jax.eval_shape(grad_fn, state["params"], first)[0][1]
        aux0 = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), aux_shape)
        (loss, grads, aux), _ = jax.lax.scan(
            body, (jnp.zeros((), jnp.float32), zeros, aux0), batch)
        n = jax.tree.leaves(batch)[0].shape[0]
        loss, grads = loss / n, jax.tree.map(lambda g: g / n, grads)
        aux = jax.tree.map(lambda a: a / n, aux)
    updates, opt_state = task.optimizer.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1,
                 "rng": state["rng"]}
    return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads),
                       "lr": _lr(task, state), **aux}


def eval_step(task: Task, params, batch):
    """The task's eval metrics on ``batch`` (leaves ``(accum, micro, ...)``), each averaged over
    the micro-batches, as float32 scalars. Reads the parameters only: nothing of the train
    state is changed or donated."""
    fn = task.eval_fn()
    assert fn is not None, "the task has no eval_data"

    def one(micro):
        return {k: jnp.asarray(v, jnp.float32) for k, v in dict(fn(params, micro)).items()}

    n = jax.tree.leaves(batch)[0].shape[0]
    if n == 1:
        return one(jax.tree.map(lambda x: x[0], batch))
    first = jax.tree.map(lambda x: x[0], batch)
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(one, first))

    def body(total, micro):
        return jax.tree.map(jnp.add, total, one(micro)), None

    total, _ = jax.lax.scan(body, zeros, batch)
    return jax.tree.map(lambda v: v / n, total)


def _lr(task: Task, state):
    """The learning rate reported as ``lr``: the task's schedule at this step, or the constant
    it gives as ``schedule``, else the one its optimizer carries in its state
    (``optax.inject_hyperparams``); 0 only when none of them says it (a plain
    ``optax.adam(1e-3)`` keeps its rate in a closure the orchestrator cannot read)."""
    if callable(task.schedule):
        return task.schedule(state["step"])
    if task.schedule is not None:
        return jnp.asarray(task.schedule, jnp.float32)
    injected = injected_lr(state["opt_state"])
    return jnp.zeros((), jnp.float32) if injected is None else injected


def injected_lr(opt_state: Any):
    """``learning_rate`` of the first ``optax.inject_hyperparams`` state in ``opt_state`` (a
    float32 scalar), None when the optimizer injects none."""
    def has_hyperparams(node: Any) -> bool:
        return isinstance(getattr(node, "hyperparams", None), Mapping)

    for node in jax.tree.leaves(opt_state, is_leaf=has_hyperparams):
        if has_hyperparams(node) and "learning_rate" in node.hyperparams:
            return jnp.asarray(node.hyperparams["learning_rate"], jnp.float32)
    return None


# ---- shardings and batches ------------------------------------------------------------------

def state_specs(task: Task, abstract_boxed: Any) -> Any:
    """The state's mesh ``PartitionSpec``s (no mesh needed), after checking every named
    parameter carries one axis name per dimension and every name is known (``check_params``).
    Parameters without names are replicated (``PartitionSpec()``), said in one note."""
    unnamed = check_params(task, abstract_boxed["params"])
    if unnamed:
        _note(replicated_note(unnamed))
    return nn.logical_to_mesh(nn.get_partition_spec(abstract_boxed), task.all_rules())


def replicated_note(unnamed: list[tuple[str, tuple[int, ...]]]) -> str:
    """The one line saying what the orchestrator chose for parameters without axis names, and
    how to choose otherwise."""
    count = sum(math.prod(shape) for _, shape in unnamed)
    listed = ", ".join(f"{where} {shape}" for where, shape in unnamed[:3])
    return (f"{len(unnamed)} parameter array(s) ({count:,} values) have no axis names and are "
            f"replicated on every device ({listed}{' ...' if len(unnamed) > 3 else ''}); to "
            "shard them, name their axes (NNX: nnx.with_partitioning(init, ('embed', 'mlp')); "
            "Linen: nn.with_logical_partitioning), docs/tasks.md \"Axis names\"")


NOTES_ENV = "TPU_ORCH_TASK_NOTES"
"""Set by the driver for its task check's subprocess: notes go to stdout after ``NOTE_MARKER``
for the driver to print once (hosts, which resolve the same task, stay silent)."""
NOTE_MARKER = "TASK_NOTE "


def _note(line: str) -> None:
    if os.environ.get(NOTES_ENV) == "1":
        print(NOTE_MARKER + line, flush=True)


def batch_specs(example: Any) -> Any:
    """Each batch leaf ``(accum, micro, *row)`` split over ``data × fsdp`` on ``micro``."""
    return jax.tree.map(lambda e: P(None, BATCH_AXES, *([None] * len(e.shape))), example)


def abstract_batch(example: Any, accum: int, micro: int) -> Any:
    return jax.tree.map(lambda e: jax.ShapeDtypeStruct((accum, micro, *e.shape), e.dtype),
                        example)


def zero_batch(shapes: Any, shardings: Any) -> Any:
    """A global batch of zeros laid out as ``shardings`` (each process makes its own shards)."""
    return jax.tree.map(lambda a, sh: jax.make_array_from_callback(
        a.shape, sh, functools.partial(_zeros, sh.shard_shape(a.shape), a.dtype)),
        shapes, shardings)


def _zeros(shape: tuple, dtype: Any, _index: Any) -> np.ndarray:
    return np.zeros(shape, dtype)


def check_params(task: Task, params: Any) -> list[tuple[str, tuple[int, ...]]]:
    """Every boxed array leaf has as many axis names as dimensions, each name a rule's. Returns
    the arrays (path, shape) without names: replicated, never refused (issue 53)."""
    known = {name for name, _ in task.all_rules()}
    bare, wrong, unknown = [], [], []
    leaves = jax.tree_util.tree_flatten_with_path(
        params, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
    for path, leaf in leaves:
        where = jax.tree_util.keystr(path)
        if not isinstance(leaf, nn.Partitioned):
            if getattr(leaf, "ndim", 0) >= 1:
                bare.append((where, tuple(leaf.shape)))
            continue
        names = tuple(leaf.names)
        if len(names) != leaf.value.ndim:
            wrong.append(f"{where} {names} for shape {tuple(leaf.value.shape)}")
        unknown += [f"{where}: {n!r}" for n in names if isinstance(n, str) and n not in known]
    if not leaves:
        raise ConfigError("task.kind", "the task's init returned no parameters",
                          "return the model's parameters from Task.init")
    if wrong:
        raise ConfigError("task.kind", f"axis names do not match the dimensions: "
                          f"{'; '.join(wrong[:3])}", "give one name (or None) per dimension")
    if unknown:
        raise ConfigError("task.kind", f"axis names no rule maps to a mesh axis: "
                          f"{'; '.join(unknown[:4])}",
                          f"add them to Task.rules (known: {', '.join(sorted(known))}), or "
                          "use a mesh axis name (data, fsdp, tensor) or None")
    return bare


def check_divisible(abstract: Any, specs: Any, axis_sizes: Mapping[str, int],
                    what: str = "state") -> None:
    """Every sharded dimension divides by the product of the mesh axes it is split over."""
    bad = []

    def visit(path, leaf, spec):
        for dim, axes in zip(leaf.shape, tuple(spec), strict=False):
            axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
            ways = math.prod(axis_sizes.get(a, 1) for a in axes)
            if dim % ways:
                bad.append(f"{jax.tree_util.keystr(path)} {tuple(leaf.shape)} over {axes} "
                           f"({ways} ways)")

    jax.tree_util.tree_map_with_path(visit, abstract, specs)
    if bad:
        raise ConfigError("mesh", f"{what} dimensions that do not divide by the mesh axes "
                          f"sharding them: {'; '.join(bad[:3])}",
                          "change mesh.ici.* / mesh.dcn.* (or train.global_batch for the "
                          "batch), or the task's sizes or axis rules")
