"""The task contract: what a user brings so that their training gets every guarantee of a run
(docs/tasks.md has a worked example).

A factory ``make_task(settings: MySettings, ctx: TaskContext) -> Task`` is named in the config
as ``task.kind: "package.module:make_task"``; ``MySettings`` (the annotation of its first
parameter) is a keyword-only dataclass validated like every other config section. The
orchestrator owns the train state around the task's parameters,
``{"params", "opt_state", "step", "rng"}``, its shardings, the data position (the step), every
checkpoint tier, the executables and the metrics; the task owns the model, the loss (or the
whole step), the optimizer and the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from orchestrator.shared.errors import ConfigError
from orchestrator.shared.sections import TrainConfig

MESH_AXES = ("data", "fsdp", "tensor")
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("vocab", "tensor"),
    ("seq", None),
)
"""Logical axis → mesh axis rules, the built-in LM's and the default for a task: FSDP shards the
embedding dimension, the tensor axis heads, MLP and vocabulary. A mesh axis name
(``data``/``fsdp``/``tensor``) used as an axis name always means that axis (explicit)."""


@dataclass(frozen=True, kw_only=True)
class TaskContext:
    """What the run tells a task factory besides its settings."""

    train: TrainConfig
    """``train.*``: ``global_batch`` (the step's global batch, after a resize that scales it),
    and the AdamW settings ``workers.task.optim.adamw_cosine`` reads (a task may ignore them)."""
    total_steps: int
    seed: int


@runtime_checkable
class DataSource(Protocol):
    """A stateless source: row ``r`` of step ``s`` is a pure function of ``(seed, s, r)``, so
    every recovery tier, resize and hand-over keeps the sample order (DESIGN "Tasks")."""

    def example(self) -> Any:
        """One row's shapes and dtypes: a pytree of ``jax.ShapeDtypeStruct`` (no batch axis)."""
        ...

    def rows(self, seed: int, step: int, rows: range) -> Any:
        """Rows ``rows`` of step ``step``'s global batch: the pytree of ``example()`` as numpy
        arrays with a leading axis of ``len(rows)``. Each process asks only for its rows."""
        ...


@runtime_checkable
class ParamSource(Protocol):
    """Existing weights a new run starts from instead of its seeded parameters
    (``Task.init_from``; the ``llama`` task's ``task.init_from``: a Hugging Face directory)."""

    def check(self, params: Any) -> None:
        """Refuse weights that are missing or do not fit ``params`` (the parameters' tree of
        ``jax.ShapeDtypeStruct``) with a ``ConfigError`` naming the setting and the fix. Reads
        headers and configs, not weights: the driver's task check calls it before anything
        starts (not when the run directory holds a committed step: a resume never reads them)."""
        ...

    def read(self, path: tuple[str, ...], index: tuple[slice, ...]) -> Any:
        """``param[index]`` of the parameter at key ``path`` in ``params`` (one device's slice,
        a numpy array in any float dtype: the caller casts it to the parameter's). Called on
        each host for its own devices' slices only."""
        ...


@dataclass(frozen=True, kw_only=True)
class Task:
    """One training task. ``init`` and ``loss``/``step`` are traced under ``jax.jit``."""

    init: Callable[[Any], Any]
    """``init(key) -> params``: every array leaf boxed with its axis names, one per dimension
    (Flax Linen ``nn.with_logical_partitioning`` / ``nn.with_partitioning``; an NNX model
    through ``workers.task.nnx.NnxModel``). ``(None, None)`` replicates on purpose."""
    optimizer: Any
    """An ``optax.GradientTransformation`` (``workers.task.optim.adamw_cosine`` builds the
    built-in LM's from ``train.*``)."""
    data: DataSource
    loss: Callable[[Any, Any], tuple[Any, dict]] | None = None
    """``loss(params, batch) -> (scalar, {name: scalar})`` on one micro-batch (the rows'
    pytree with a leading batch axis); the dict's entries are reported beside the loss."""
    step: Callable[[dict, Any], tuple[dict, dict]] | None = None
    """Instead of ``loss``, the whole step: ``step(state, batch) -> (state, metrics)``, with
    ``state`` the orchestrator's dict, batch ``(accum, micro, ...)``; it must return the
    state's tree with ``step`` advanced by one and ``metrics["loss"]``."""
    schedule: Callable[[Any], Any] | float | None = None
    """The LR schedule (an ``optax.Schedule``), or a constant LR as a number, reported as
    ``lr``. None: the optimizer's own ``learning_rate`` when it carries one in its state
    (``optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)``), else 0 (a plain
    ``optax.adam(1e-3)`` keeps its rate where it cannot be read: give it here)."""
    rules: tuple[tuple[str, Any], ...] = DEFAULT_RULES
    """Logical axis name → mesh axis (or None, or a tuple of axes)."""
    flops_per_step: float | None = None
    """Model FLOPs of one step of the global batch (forward + backward) for MFU; None takes
    XLA's count of the compiled step."""
    tokens_per_example: int = 1
    """Throughput counts ``global_batch × tokens_per_example`` per step."""
    eval_data: DataSource | None = None
    """The held-out split (``eval.*`` evaluates on it): a stateless source like ``data`` whose
    ``rows(seed, b, rows)`` are rows of eval batch ``b`` (``b`` = 0, 1, ... ``eval.batches`` - 1,
    the same rows at every eval). Its rows must be none of the training rows (a disjoint seed
    stream, or a split held out when the data was prepared). A source that knows its size
    says it with ``__len__`` (rows it holds): an eval needing more is refused before the run
    starts, never wrapped around."""
    eval_step: Callable[[Any, Any], dict] | None = None
    """``eval_step(params, batch) -> {name: scalar}`` on one micro-batch of ``eval_data``
    (a leading batch axis), at least ``loss``; every entry is averaged over the eval's
    micro-batches (equal sizes: return means). None: ``loss``'s value and its dict. No RNG is
    passed: an eval is deterministic and leaves the train state, its RNG and the data position
    as they were. ``perplexity`` is reported as exp(loss) (a perplexity when ``loss`` is a
    per-token negative log-likelihood in nats)."""
    init_from: ParamSource | None = None
    """Weights a new run starts from: after the seeded init (optimizer state, step and RNG as
    for any new run; an optimizer whose state copies the parameters holds the seeded ones)
    each parameter is replaced by ``init_from.read``'s slices, each host reading only its own
    devices' (``workers/training/init_from.py``). Only a run with no committed step reads
    them: a restore from any tier takes the run's own state. None: the seeded parameters."""
    code: tuple[str, ...] = ()
    """Modules outside the factory's package whose source defines the step (the executable
    key digests them with the factory's package: an edit never loads a stale step)."""

    def __post_init__(self) -> None:
        for name in ("init",):
            _callable(name, getattr(self, name))
        if self.loss is None and self.step is None:
            _bad("loss", "neither `loss` nor `step` is given",
                 "give Task(loss=...) (the orchestrator's step) or Task(step=...) (your own)")
        for name in ("loss", "step"):
            if getattr(self, name) is not None:
                _callable(name, getattr(self, name))
        _check_schedule(self.schedule)
        if not (hasattr(self.optimizer, "init") and hasattr(self.optimizer, "update")):
            _bad("optimizer", f"{type(self.optimizer).__name__} is not an optax "
                 "GradientTransformation", "pass optax.adamw(...) or "
                 "workers.task.optim.adamw_cosine(ctx)")
        if not isinstance(self.data, DataSource):
            _bad("data", f"{type(self.data).__name__} has no example() and rows(seed, step, "
                 "rows)", "pass a stateless source (workers.task.contract.DataSource)")
        if self.eval_step is not None:
            _callable("eval_step", self.eval_step)
            if self.eval_data is None:
                _bad("eval_step", "is given without eval_data (nothing to evaluate on)",
                     "give the held-out split as Task(eval_data=...), or drop eval_step")
        if self.eval_data is not None:
            if not isinstance(self.eval_data, DataSource):
                _bad("eval_data", f"{type(self.eval_data).__name__} has no example() and "
                     "rows(seed, step, rows)", "pass a stateless source of held-out rows "
                     "(workers.task.contract.DataSource)")
            if self.eval_step is None and self.loss is None:
                _bad("eval_step", "the task gives its own step and eval_data but no eval_step "
                     "(there is no loss to evaluate with)",
                     "give Task(eval_step=lambda params, batch: {'loss': ...})")
        if self.init_from is not None and not isinstance(self.init_from, ParamSource):
            _bad("init_from", f"{type(self.init_from).__name__} has no check(params) and "
                 "read(path, index)", "pass a workers.task.contract.ParamSource, or None")
        if not isinstance(self.tokens_per_example, int) or self.tokens_per_example < 1:
            _bad("tokens_per_example", f"{self.tokens_per_example!r} is not a whole number >= 1",
                 "count the tokens one example holds (1 for non-sequence data)")
        f = self.flops_per_step
        if f is not None and not (isinstance(f, int | float) and f > 0):
            _bad("flops_per_step", f"{f!r} is not a positive number",
                 "give the step's model FLOPs, or None for XLA's count")
        if not all(isinstance(m, str) for m in self.code):
            _bad("code", f"{self.code!r} is not a tuple of module names",
                 "list importable module names, e.g. ('my_pkg.layers',)")

    def eval_fn(self) -> Callable[[Any, Any], dict] | None:
        """The eval of one micro-batch: ``eval_step``, else ``loss``'s value and its dict as
        ``{"loss": ..., **dict}``; None without ``eval_data``."""
        if self.eval_data is None:
            return None
        if self.eval_step is not None:
            return self.eval_step
        loss = self.loss
        assert loss is not None

        def from_loss(params: Any, batch: Any) -> dict:
            value, aux = loss(params, batch)
            return {**aux, "loss": value}

        return from_loss

    def all_rules(self) -> tuple[tuple[str, Any], ...]:
        """``rules`` plus each mesh axis naming itself (explicit shardings)."""
        return tuple(self.rules) + tuple((a, a) for a in MESH_AXES)


def _check_schedule(value: Any) -> None:
    """A schedule is a function of the step, or a constant rate (a finite number >= 0)."""
    if value is None or callable(value):
        return
    if isinstance(value, int | float) and not isinstance(value, bool) and \
            math.isfinite(value) and value >= 0:
        return
    _bad("schedule", f"{value!r} is neither callable nor a learning rate",
         "pass an optax schedule (step -> rate), or the constant rate, e.g. Task(schedule=1e-3)")


def _callable(name: str, value: Any) -> None:
    if not callable(value):
        _bad(name, f"{value!r} is not callable", f"pass a function as Task({name}=...)")


def _bad(field_name: str, problem: str, fix: str) -> None:
    raise ConfigError("task.kind", f"the task's `{field_name}`: {problem}", fix)
