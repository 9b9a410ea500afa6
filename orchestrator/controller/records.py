"""The per-step record host 0 reports and every metric sink consumes (see docs/CONTRACTS.md),
and the eval record a task's evaluations produce.

One frozen shape crosses the actor boundary and lands in ``metrics.jsonl``; readers of old or
partial files go through ``StepRecord.from_dict`` so a missing optional field never crashes the
report.

It lives with the controller, which builds it (``running``) and names it in its listener
interface; the metric sinks, a layer up, import it from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.task import METRIC_NAME


class BadStepRecord(OrchestratorError):
    """A metrics.jsonl line or a reported dict is not a StepRecord."""


def mfu(flops_per_step: float, step_time_s: float, devices: int,
        peak_flops_per_device: float) -> float:
    """Fraction of the devices' peak the step's model FLOPs used; 0.0 when undefined.

    Returns 0.0 (not an exception) for a non-positive time, device count or peak: a bad sample
    must never crash the training loop that reports it.
    """
    if step_time_s <= 0 or devices <= 0 or peak_flops_per_device <= 0 or flops_per_step <= 0:
        return 0.0
    return flops_per_step / (step_time_s * devices * peak_flops_per_device)


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One training step as host 0 saw it.

    ``flops`` is the global model FLOPs of the step (all devices); ``mfu`` is already computed
    against ``peak_flops_per_device`` whose origin ``peak_source`` names ("table:v5e",
    "configured", "measured:cpu-matmul"). ``wall_time`` is the unix time the step ended.
    """

    step: int
    loss: float
    step_time_s: float
    tokens: int
    flops: float
    grad_norm: float
    wall_time: float
    devices: int
    peak_flops_per_device: float
    peak_source: str
    mfu: float
    incarnation: int
    slices: int
    checkpoint_blocking_s: float = 0.0
    lr: float = 0.0
    ram_copy_s: float = 0.0
    """Seconds the step waited to copy its state to the RAM tier (0 with the tier off)."""
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """The task's own step metrics by name (its loss's second output; docs/tasks.md)."""

    @property
    def tokens_per_second(self) -> float:
        """Throughput of this step; 0 when the step time is not positive."""
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @classmethod
    def build(cls, *, step: int, loss: float, step_time_s: float, tokens: int, flops: float,
              grad_norm: float, wall_time: float, devices: int, peak: tuple[float, str],
              incarnation: int, slices: int, checkpoint_blocking_s: float = 0.0,
              lr: float = 0.0, ram_copy_s: float = 0.0,
              metrics: Mapping[str, float] | None = None) -> StepRecord:
        """A record with MFU computed from ``peak`` = ``mfu.resolve_peak(...)`` (value, source).

        For the driver: host 0 reports raw numbers, the driver knows the peak and the mesh.
        """
        value, source = peak
        return cls(step=step, loss=loss, step_time_s=step_time_s, tokens=tokens, flops=flops,
                   grad_norm=grad_norm, wall_time=wall_time, devices=devices,
                   peak_flops_per_device=value, peak_source=source,
                   mfu=mfu(flops, step_time_s, devices, value), incarnation=incarnation,
                   slices=slices, checkpoint_blocking_s=checkpoint_blocking_s, lr=lr,
                   ram_copy_s=ram_copy_s, metrics=dict(metrics or {}))

    def to_dict(self) -> dict[str, Any]:
        """Flat field dict (``dataclasses.asdict`` deep-copies: far slower, once per step)."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        """Validate a plain mapping (a JSONL line); unknown keys are ignored for forward compat."""
        if not isinstance(data, Mapping):
            raise BadStepRecord(f"a step record must be a mapping, got {type(data).__name__}",
                                fix="write one JSON object per metrics.jsonl line")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise BadStepRecord(f"step record lacks `{f.name}`",
                                        fix="report every StepRecord field from host 0")
                continue
            kwargs[f.name] = _coerce(f.name, f.type, data[f.name])
        return cls(**kwargs)


def _coerce(name: str, tp: Any, value: Any) -> Any:
    kind = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    try:
        if kind == "int":
            if isinstance(value, bool) or not float(value).is_integer():
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if math.isnan(out) and name not in ("loss", "grad_norm"):
                raise ValueError
            return out
        if kind == "str":
            return str(value)
        if kind.startswith("Mapping"):  # the task's metrics: name -> number
            if not isinstance(value, Mapping):
                raise TypeError
            return {str(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError):
        raise BadStepRecord(f"step record field `{name}` has bad value {value!r}",
                            fix=f"report `{name}` as a {kind}") from None
    return value


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepRecord))

_SPLIT = METRIC_NAME


@dataclass(frozen=True, kw_only=True)
class EvalRecord:
    """One evaluation of the model at ``step`` (the task API's eval results, driver-side).

    ``loss`` is the mean per-token cross-entropy (nats) over ``tokens`` evaluated tokens;
    ``perplexity`` is derived from it. ``split`` names the data evaluated ("eval", "val",
    "test": a metric prefix, so lower-case letters, digits and ``_``); ``metrics`` holds any
    further named scalars the task reports (accuracy, ...). Sinks receive it through
    ``RunListener.on_eval``.
    """

    step: int
    loss: float
    wall_time: float
    tokens: int = 0
    split: str = "eval"
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    """Wall time the eval took on the hosts (its batches read, its forward passes)."""

    def __post_init__(self) -> None:
        if not _SPLIT.match(self.split):
            raise BadStepRecord(f"eval split {self.split!r} is not a metric name",
                                fix="name the split with lower-case letters, digits and _, "
                                    "e.g. eval or val")
        for name in self.metrics:
            if not _SPLIT.match(str(name)) or name in ("loss", "perplexity"):
                raise BadStepRecord(f"eval metric {name!r} is not a metric name or is reserved",
                                    fix="name extra eval metrics with lower-case letters, "
                                        "digits and _, other than loss and perplexity")

    @property
    def perplexity(self) -> float:
        """exp(loss); inf when that overflows, NaN when the loss is NaN."""
        try:
            return math.exp(self.loss)
        except OverflowError:
            return math.inf

    def to_dict(self) -> dict[str, Any]:
        """Its ``metrics.jsonl`` line: ``kind: eval`` tells it from step records (whose
        readers skip it)."""
        return {"kind": "eval", "split": self.split, "step": self.step, "loss": self.loss,
                "perplexity": self.perplexity, "tokens": self.tokens, "seconds": self.seconds,
                "metrics": dict(self.metrics), "wall_time": self.wall_time}

    @classmethod
    def from_host(cls, step: int, ev: Mapping[str, Any]) -> EvalRecord:
        """From the ``eval`` entry of host 0's record of ``step`` (``workers.training.trainer``)."""
        return cls(step=int(step), loss=float(ev["loss"]),
                   wall_time=float(ev.get("wall_time") or 0.0), tokens=int(ev.get("tokens", 0)),
                   split=str(ev.get("split", "eval")),
                   metrics={str(k): float(v) for k, v in (ev.get("metrics") or {}).items()},
                   seconds=float(ev.get("seconds", 0.0)))
