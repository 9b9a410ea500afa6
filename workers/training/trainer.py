"""Everything JAX for one process: mesh, model, sharded train state, jitted step, Orbax I/O.

Runs inside a host actor (many processes, one JAX group) and equally in a plain process (one
process, many devices), so the multi-host result can be checked against a single-process run.
The caller (host actor) must have set XLA/device env and called ``jax.distributed.initialize``
before constructing a Trainer. Orbax I/O lives in ``workers.training.checkpoints``.
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
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orchestrator.shared.errors import ConfigError
from orchestrator.shared.hostspec import HostSpec
from workers.task import data_state
from workers.task.contract import TaskContext
from workers.task.resolve import ResolvedTask, resolve
from workers.task.state import (
    RESERVED_METRICS,
    abstract_batch,
    batch_specs,
    check_divisible,
    eval_step,
    init_unboxed,
    state_specs,
    train_step,
    zero_batch,
)
from workers.training.checkpoints import CheckpointStore, RestoreOutcome
from workers.training.compile_share import CompileInfo, obtain, share_for
from workers.training.executables import (
    ExecutableStore,
    executable_key,
    mesh_ingredients,
    runtime_ingredients,
)
from workers.training.init_from import load_params
from workers.training.mesh import build_mesh
from workers.training.outputs import EvalOutput, SaveOutput, StepOutput

log = logging.getLogger(__name__)

EVAL_FIX = ("set eval.every=0, or give the task a held-out split: Task(eval_data=...) "
            "(docs/tasks.md; for prepared data, prepare with --eval-records N)")


class Trainer:
    """One process's share of the run. Not thread-safe: one caller drives it (``step`` may be
    read from other threads: it is a plain int on the host)."""

    def __init__(self, spec: HostSpec, *, before_commit: Callable[[], None] | None = None,
                 devices: list | None = None) -> None:
        """``before_commit``: see ``CheckpointStore`` (tests hold a save in flight with it).
        ``devices``: build the mesh over these only (``workers.host.ahead``)."""
        self.spec = spec
        self.plan = spec.plan
        self.accum_steps = spec.accum_steps
        self.mesh = build_mesh(spec.plan, devices)
        self.resolved = task_for(spec)
        task = self.task = self.resolved.task
        self.global_batch = spec.train.global_batch
        self.micro = self.global_batch // spec.accum_steps
        self.example = task.data.example()
        self.batch_shape = abstract_batch(self.example, spec.accum_steps, self.micro)
        self.batch_sharding = _named(self.mesh, batch_specs(self.example))
        self.replicated = NamedSharding(self.mesh, P())
        abstract_boxed = self.resolved.abstract_boxed
        specs = state_specs(task, abstract_boxed)
        abstract = nn.meta.unbox(abstract_boxed)
        check_divisible(abstract, specs, dict(self.mesh.shape))
        check_divisible(self.batch_shape, batch_specs(self.example), dict(self.mesh.shape),
                        "batch")
        self.state_sharding = _named(self.mesh, specs)
        self.abstract_state = jax.tree.map(
            lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
            abstract, self.state_sharding)
        self.n_params = int(sum(math.prod(a.shape) for a in jax.tree.leaves(abstract["params"])))
        # no lambda over ``self`` kept on ``self``: that cycle kept the arrays alive after the
        # trainer was dropped, until a full collection (``workers.host.warm`` needs them gone at
        # once)
        self._init = jax.jit(functools.partial(init_unboxed, task),
                             out_shardings=self.state_sharding)
        self._step_fn = jax.jit(
            functools.partial(train_step, task),
            in_shardings=(self.state_sharding, self.batch_sharding),
            out_shardings=(self.state_sharding, self.replicated),
            donate_argnums=(0,),
        )
        self._compiled = None
        self._init_compiled = None
        self._setup_eval(spec)
        self.executables = (ExecutableStore(spec.executables_dir, key_file=spec.executables_key)
                            if spec.executables_dir else None)
        self._key_parts: tuple[dict, dict] | None = None
        self.share = share_for(list(self.mesh.devices.flat), platform=spec.plan.platform,
                               enabled=spec.share_compile, store=self.executables is not None,
                               wait_s=spec.share_wait_s)
        self.compile_info: CompileInfo | None = None
        self.init_info: CompileInfo | None = None
        self.flops_xla: float | None = None
        self.flops_analytic = task.flops_per_step
        self.tokens_per_step = self.global_batch * task.tokens_per_example
        self.state: Any = None
        self._host_step: int | None = None
        self.data_resumed: dict | None = None
        """Where the last restore resumed the data (``data_state.resume``)."""
        self.ckpt = CheckpointStore(
            spec.checkpoint_dir, keep=spec.checkpoint.keep, async_save=spec.checkpoint.async_save,
            model_fingerprint=self.resolved.fingerprint,
            model_desc=json.dumps(self.resolved.describe()), before_commit=before_commit)

    # ---- construction -------------------------------------------------------------------

    def _setup_eval(self, spec: HostSpec) -> None:
        """The eval's batch layout and jitted function (the task's ``eval_data``, laid out
        like a training batch: ``(accum, micro, ...)`` over the same mesh axes)."""
        self.eval_every, self.eval_batches = spec.eval.every, spec.eval.batches
        self._eval_compiled = None
        self.eval_info: CompileInfo | None = None
        data = self.task.eval_data
        if data is None:
            if self.eval_every:
                raise ConfigError("eval.every", f"eval.every={self.eval_every} but the task "
                                  f"{self.resolved.ref.kind!r} has no held-out split "
                                  "(Task.eval_data is None)", EVAL_FIX)
            return
        self.eval_example = data.example()
        self.eval_shape = abstract_batch(self.eval_example, self.accum_steps, self.micro)
        self.eval_sharding = _named(self.mesh, batch_specs(self.eval_example))
        check_divisible(self.eval_shape, batch_specs(self.eval_example), dict(self.mesh.shape),
                        "eval batch")
        self._eval_fn = jax.jit(functools.partial(eval_step, self.task),
                                in_shardings=(self.state_sharding["params"], self.eval_sharding),
                                out_shardings=self.replicated)

    def compile(self) -> float:
        """Load the step's executable from the store, or lower and compile it; returns the
        seconds it took (``compile_info`` says which). Records XLA's FLOP count."""
        t0 = time.perf_counter()
        batch = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                             self.batch_shape, self.batch_sharding)
        self._compiled, self.compile_info = self._executable(
            "train_step", self._step_fn, (self.abstract_state, batch), cost=True)
        self.flops_xla = self.compile_info.flops
        if self.eval_every:
            self.compile_eval()
        return time.perf_counter() - t0

    def compile_eval(self) -> None:
        """Load or compile the eval (with ``eval.every`` on, ``compile`` does it too, so a
        group's first eval costs no compile); its own key (``function`` ``eval_step``)."""
        params = self.abstract_state["params"]  # shapes with their shardings
        batch = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                             self.eval_shape, self.eval_sharding)
        self._eval_compiled, self.eval_info = self._executable("eval_step", self._eval_fn,
                                                               (params, batch))

    def init_state(self, seed: int, *, init_from: bool = True) -> None:
        """A new run's state from ``seed``; with the task's ``init_from`` (and ``init_from``
        left on) its parameters are then those weights (``workers.training.init_from``)."""
        if self._init_compiled is None:
            abstract_key = jax.eval_shape(lambda: jax.random.key(0))
            self._init_compiled, self.init_info = self._executable("init", self._init,
                                                                   (abstract_key,))
        self.state = self._init_compiled(jax.random.key(seed))
        if init_from and self.task.init_from is not None:
            self.state["params"] = load_params(self.task.init_from, self.state["params"])
        self._host_step = None
        self.data_resumed = self._resume_data(None, None, "seed")

    def run_once(self) -> float:
        """The step once on the seed state and a zero batch, the state dropped (no data read,
        no step counted): XLA:CPU's first run of an executable costs several steps, paid here
        by a pre-formed group before its switch (``workers.host.actor.preform``)."""
        t0 = time.perf_counter()
        self.init_state(self.spec.seed, init_from=False)  # dropped: no weights worth reading
        zeros = zero_batch(self.batch_shape, self.batch_sharding)
        _, metrics = self._compiled(self.state, zeros)  # the state is donated: gone now
        jax.block_until_ready(metrics)
        self.state, self._host_step = None, None
        return time.perf_counter() - t0

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
        """The store key of this process's executable of ``function``
        (``workers.training.executables``)."""
        if self._key_parts is None:
            self._key_parts = (runtime_ingredients(), mesh_ingredients(
                self.mesh, self.plan.shape.as_dict(), num_slices=self.plan.num_slices))
        runtime, mesh = self._key_parts
        config = {"task": self.resolved.describe(), "task_code": self.resolved.code_digest,
                  "train": dataclasses.asdict(self.spec.train),
                  "total_steps": self.spec.total_steps, "accum_steps": self.accum_steps}
        count = len({d.process_index for d in self.mesh.devices.flat})  # a prefix if ahead
        index = self.share.owner if self.share is not None else jax.process_index()
        return executable_key(function=function, runtime=runtime, config=config, mesh=mesh,
                              process_index=index, process_count=count)

    # ---- data ---------------------------------------------------------------------------

    def batch(self, step: int) -> Any:
        """Global batch for ``step`` built from this process's rows only (each device's rows
        asked of the task's data once, whatever the number of leaves)."""
        return self._global_batch(self.task.data, step, self.example, self.batch_shape,
                                  self.batch_sharding)

    def eval_batch(self, index: int) -> Any:
        """Eval batch ``index`` of the held-out split, laid out as a training batch."""
        return self._global_batch(self.task.eval_data, index, self.eval_example,
                                  self.eval_shape, self.eval_sharding)

    def _global_batch(self, data: Any, step: int, example: Any, batch_shape: Any,
                      batch_sharding: Any) -> Any:
        seed, micro = self.spec.seed, self.micro
        treedef = jax.tree.structure(example)
        cache: dict[tuple, list] = {}

        def rows(index) -> list:
            key = tuple((s.start, s.stop, s.step) for s in index[:2])
            if key not in cache:
                a_idx = range(self.accum_steps)[index[0]]
                r_idx = range(micro)[index[1]]
                parts = [data.rows(seed, step, range(a * micro + r_idx.start,
                                                     a * micro + r_idx.stop)) for a in a_idx]
                cache[key] = treedef.flatten_up_to(jax.tree.map(lambda *x: np.stack(x), *parts))
            return cache[key]

        leaves = [jax.make_array_from_callback(
            shape.shape, sharding, functools.partial(_leaf_rows, rows, i))
            for i, (shape, sharding) in enumerate(zip(
                treedef.flatten_up_to(batch_shape),
                treedef.flatten_up_to(batch_sharding), strict=True))]
        return treedef.unflatten(leaves)

    # ---- stepping -----------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The state's step, mirrored on the host: reading the device array each step would
        add a device→host sync to every step (bench/RESULTS.md, section 1)."""
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
        # one device->host copy; the LR comes from the jitted step (an eager op would compile)
        got = jax.device_get(metrics)
        dt = time.perf_counter() - t0
        return StepOutput(step=step + 1, loss=float(got["loss"]),
                          grad_norm=float(got["grad_norm"]), step_time_s=dt, lr=float(got["lr"]),
                          extra={k: float(v) for k, v in got.items()
                                 if k not in RESERVED_METRICS})

    # ---- the data position --------------------------------------------------------------

    def data_record(self, *, every_process: bool = False) -> dict:
        """The data position of the current step (``workers.task.data_state``): this
        process's for a RAM copy; ``every_process`` gathers every process's iterator state
        (an iterator source only; a collective) for the Orbax item."""
        data = self.task.data
        iterators = None
        if every_process and data_state.is_stateful(data):
            iterators = data_state.gather(data.state(), jax.process_count())
        return data_state.record(data, self.step, process_index=jax.process_index(),
                                 process_count=jax.process_count(), iterators=iterators)

    def _resume_data(self, saved: dict | None, step: int | None, tier: str) -> dict:
        return data_state.resume(self.task.data, saved, step=step, tier=tier,
                                 process_index=jax.process_index(),
                                 process_count=jax.process_count())

    def evaluate(self, batches: int | None = None) -> EvalOutput:
        """The task's eval of the current parameters on ``batches`` (default ``eval.batches``)
        held-out batches: the same rows at every eval. Reads the parameters only; the state,
        its RNG and the step (the data position) stay as they are."""
        if self.task.eval_data is None:
            raise ConfigError("eval.every", f"the task {self.resolved.ref.kind!r} has no "
                              "held-out split (Task.eval_data is None)", EVAL_FIX)
        if self._eval_compiled is None:
            self.compile_eval()
        n = self.eval_batches if batches is None else batches
        t0 = time.perf_counter()
        params = self.state["params"]
        outs = [self._eval_compiled(params, self.eval_batch(b)) for b in range(n)]
        got = jax.device_get(outs)  # one device->host copy for the whole eval
        means = {k: float(np.mean([o[k] for o in got], dtype=np.float64)) for k in got[0]}
        return EvalOutput(step=self.step, loss=means.pop("loss"), metrics=means, batches=n,
                          rows=n * self.global_batch, seconds=time.perf_counter() - t0)

    # ---- checkpoints --------------------------------------------------------------------

    def save(self, *, wait: bool = False) -> SaveOutput:
        """Save the current step (async unless ``wait``).

        A step already saved or being saved is not saved twice (``wait`` still waits for it).
        """
        t0 = time.perf_counter()
        step = self.step
        meta = {"step": step, "task": self.resolved.describe(),
                "task_fingerprint": self.resolved.fingerprint,
                "model_fingerprint": self.resolved.fingerprint,  # what older versions read
                "plan": self.plan.describe(), "config_digest": self.spec.config_digest}
        if self.resolved.ref.kind == "lm":  # the lm task's settings, where tools look for them
            meta["model"] = self.resolved.settings_dict
        started = self.ckpt.save(step, self.state, meta,
                                 data=self.data_record(every_process=True))
        if wait:
            self.ckpt.wait()
        return SaveOutput(step=step, started=started, blocking_s=time.perf_counter() - t0)

    def restore(self, skip_steps: Collection[int] = ()) -> RestoreOutcome:
        """Restore the newest usable committed step (see ``CheckpointStore.restore``), or
        initialise from the seed (and the task's ``init_from``) when there is none."""
        out = self.ckpt.restore(self.abstract_state, skip_steps=skip_steps,
                                process_index=jax.process_index(),
                                process_count=jax.process_count())
        if out.step is None:
            self.init_state(self.spec.seed)
        else:
            self.state = out.state
            out.state = None
            self._host_step = None
            self.data_resumed = self._resume_data(out.data, self.step, "durable")
        return out

    def restore_from_copies(self, step: int, copies: list[tuple[dict, bytes]], *,
                            sources: list[int] | None = None, tier: str = "ram",
                            layouts: dict[int, dict] | None = None) -> None:
        """Take the state of ``step`` from RAM copies (``workers.ram.replica``), in this mesh, and
        the data position from their layouts (``sources``: each copy's source index, default
        their order; ``tier``: "ram", or "copy" for the copies saved from RAM; ``layouts``:
        every source's layout when ``copies`` hold only those this host's shards need)."""
        from workers.ram.replica import ReplicaMismatch, place

        state = place(copies, self.abstract_state)
        found = int(jax.device_get(state["step"]))
        if found != step:
            raise ReplicaMismatch(f"the copies hold step {found}, not {step}")
        order = sources if sources is not None else list(range(len(copies)))
        if layouts is None:
            layouts = {src: layout for src, (layout, _) in zip(order, copies, strict=True)}
        saved = data_state.from_copies({src: layout.get("data")
                                        for src, layout in layouts.items()})
        resumed = self._resume_data(saved, found, tier)  # before the state is taken
        self.state = state
        self._host_step = found
        self.data_resumed = resumed

    def params_host(self) -> dict:
        """Parameters gathered to host numpy (tests compare runs with it)."""
        from jax.experimental import multihost_utils

        return jax.tree.map(np.asarray,
                            multihost_utils.process_allgather(self.state["params"], tiled=True))

    def close(self) -> None:
        self.ckpt.close()


def task_for(spec: HostSpec) -> ResolvedTask:
    """The spec's task, resolved (once per process for the same task, train config and run)."""
    return resolve(spec.task, TaskContext(train=spec.train, total_steps=spec.total_steps,
                                          seed=spec.seed))


def _named(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda p: NamedSharding(mesh, p), specs,
                        is_leaf=lambda x: isinstance(x, P))


def _leaf_rows(rows: Callable[[tuple], list], i: int, index: tuple) -> np.ndarray:
    """Leaf ``i`` of the rows for device shard ``index`` (accum, micro, then the row's axes)."""
    return rows(index)[i][(slice(None), slice(None), *index[2:])]
