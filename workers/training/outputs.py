"""What the trainer's calls return: a save's, an eval's and a step's results (plain data)."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class SaveOutput:
    step: int
    started: bool
    """False when this step was already saved or being saved."""
    blocking_s: float
    """Seconds the caller was blocked (the async part runs on in Orbax's thread)."""


@dataclasses.dataclass
class EvalOutput:
    """One eval of the state at ``step`` on the task's held-out split."""

    step: int
    loss: float
    metrics: dict
    """The eval's other metrics by name (each a mean over the eval's micro-batches)."""
    batches: int
    rows: int
    seconds: float
    """Wall time of the eval: reading its batches, the forward passes, one device→host copy."""

    def as_record(self, tokens_per_example: int) -> dict:
        """What host 0's step record carries under ``eval`` (the driver's ``EvalRecord``)."""
        return {"split": "eval", "loss": self.loss, "metrics": dict(self.metrics),
                "batches": self.batches, "rows": self.rows,
                "tokens": self.rows * tokens_per_example, "seconds": self.seconds,
                "wall_time": time.time()}


@dataclasses.dataclass
class StepOutput:
    step: int
    loss: float
    grad_norm: float
    step_time_s: float
    lr: float
    extra: dict = dataclasses.field(default_factory=dict)
    """The task's own metrics (its loss's second output), by name."""
