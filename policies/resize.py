"""Global batch semantics when the data-parallel size changes (DCN axis shrinks or grows).

KEEP: the optimiser sees the same global batch every step. Each replica keeps its micro-batch
and accumulates ``base_dp / new_dp`` micro-steps per optimiser step (or, when growing past the
base, each replica takes a smaller share). Learning rate unchanged. Loss curves stay comparable
and a shrink/grow cycle does not change the training recipe.
SCALE: each replica keeps its micro-batch and there is no accumulation, so the global batch
scales with the data-parallel size; throughput per step follows the hardware. The learning rate
is scaled by ``lr_scaling``: ``linear`` (Goyal et al. 2017: lr ∝ batch), ``sqrt`` (lr ∝ √batch,
common for Adam-family optimisers), or ``none``. The step count target is unchanged in both modes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class BatchMode(StrEnum):
    KEEP = "keep"
    SCALE = "scale"


@dataclass(frozen=True, kw_only=True)
class ResizeObservation:
    """The configured (base) global batch and data-parallel size, and the new one.

    ``processes``: JAX processes in the new group; the per-micro-step global batch must divide
    by it (each process feeds its local rows).
    """

    base_global_batch: int
    base_dp: int
    new_dp: int
    processes: int = 1


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """Per-step plan for the new mesh. ``global_batch`` is rows per optimiser step;
    ``micro_batch_per_replica`` rows per replica per micro-step; ``accum_steps`` micro-steps per
    optimiser step; ``lr_scale`` multiplies the configured learning rate."""

    mode: BatchMode
    dp: int
    global_batch: int
    micro_batch_per_replica: int
    accum_steps: int
    lr_scale: float
    reason: str

    @property
    def micro_global_batch(self) -> int:
        return self.micro_batch_per_replica * self.dp


@dataclass(frozen=True, kw_only=True)
class ResizeInfeasible:
    """The new size cannot honour the chosen semantics; ``fix`` names what to change."""

    reason: str
    fix: str


ResizeDecision = BatchPlan | ResizeInfeasible


@dataclass(frozen=True, kw_only=True)
class ResizePolicy:
    mode: BatchMode = BatchMode.KEEP
    lr_scaling: str = "linear"

    def __post_init__(self) -> None:
        if self.lr_scaling not in ("linear", "sqrt", "none"):
            raise ValueError("lr_scaling must be 'linear', 'sqrt' or 'none'")

    def decide(self, observation: ResizeObservation) -> ResizeDecision:
        obs = observation
        if obs.base_dp < 1 or obs.new_dp < 1 or obs.processes < 1 or obs.base_global_batch < 1:
            return ResizeInfeasible(
                reason=f"sizes must be positive: {obs}", fix="check mesh and train.global_batch"
            )
        if obs.base_global_batch % obs.base_dp:
            return ResizeInfeasible(
                reason=f"global batch {obs.base_global_batch} does not divide by the base "
                f"data-parallel size {obs.base_dp}",
                fix="set train.global_batch to a multiple of the data-parallel size",
            )
        micro = obs.base_global_batch // obs.base_dp
        plan = self._keep(obs, micro) if self.mode is BatchMode.KEEP else self._scale(obs, micro)
        if isinstance(plan, BatchPlan) and plan.micro_global_batch % obs.processes:
            return ResizeInfeasible(
                reason=f"{plan.micro_global_batch} rows per micro-step do not divide by "
                f"{obs.processes} processes",
                fix="use a global batch divisible by every host count the run may shrink to",
            )
        return plan

    def _keep(self, obs: ResizeObservation, micro: int) -> ResizeDecision:
        if obs.base_dp % obs.new_dp == 0:
            accum = obs.base_dp // obs.new_dp
            return BatchPlan(
                mode=BatchMode.KEEP, dp=obs.new_dp, global_batch=obs.base_global_batch,
                micro_batch_per_replica=micro, accum_steps=accum, lr_scale=1.0,
                reason=f"keep global batch {obs.base_global_batch}: dp {obs.base_dp} -> "
                f"{obs.new_dp}, {accum} accumulation step(s)",
            )
        if obs.new_dp > obs.base_dp and obs.base_global_batch % obs.new_dp == 0:
            share = obs.base_global_batch // obs.new_dp
            return BatchPlan(
                mode=BatchMode.KEEP, dp=obs.new_dp, global_batch=obs.base_global_batch,
                micro_batch_per_replica=share, accum_steps=1, lr_scale=1.0,
                reason=f"keep global batch {obs.base_global_batch}: dp {obs.base_dp} -> "
                f"{obs.new_dp}, {share} rows per replica",
            )
        return ResizeInfeasible(
            reason=f"cannot keep global batch {obs.base_global_batch} on dp {obs.new_dp}: "
            f"base dp {obs.base_dp} is not a multiple of it",
            fix="set controller.batch_on_resize=scale, or controller.elastic.min_slices so "
            "every reachable slice count divides the configured one",
        )

    def _scale(self, obs: ResizeObservation, micro: int) -> ResizeDecision:
        ratio = obs.new_dp / obs.base_dp
        lr = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.lr_scaling]
        return BatchPlan(
            mode=BatchMode.SCALE, dp=obs.new_dp, global_batch=micro * obs.new_dp,
            micro_batch_per_replica=micro, accum_steps=1, lr_scale=lr,
            reason=f"scale global batch {obs.base_global_batch} -> {micro * obs.new_dp} "
            f"(dp {obs.base_dp} -> {obs.new_dp}), lr x{lr:g} ({self.lr_scaling})",
        )
