"""Config section ``controller``: budgets, backoff, capacity wait, elasticity, save and health
policies, and the chaos schedule. ``ControllerConfig.build_policies()`` turns it into the pure
policy objects the controller calls, so the controller never reads raw settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.shared.errors import ConfigError
from policies.causes import StopCause, StopClassifier
from policies.chaos import Fault, FaultKind, FaultSchedule
from policies.checkpoint_interval import FixedInterval, SavePolicy, YoungDaly
from policies.health import HealthPolicy
from policies.preemption import DeadlinePolicy, GrowPolicy, PlacementPolicy
from policies.reaction import ReactionPolicy
from policies.resize import BatchMode, ResizePolicy
from policies.restart_budget import RestartBudgetPolicy

P = "controller"


def _need(ok: bool, setting: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(setting=f"{P}.{setting}", problem=problem, fix=fix)


def _finite(x: float) -> bool:
    return math.isfinite(x)


@dataclass(frozen=True, kw_only=True)
class BudgetsConfig:
    """Restarts allowed per stop cause (field names = StopCause values)."""

    spot_preemption: int = 100
    maintenance: int = 100
    hardware_health: int = 10
    host_lost: int = 10
    timeout: int = 5
    application_error: int = 2
    operator: int = 100
    checkpoint_corrupt: int = 5

    def __post_init__(self) -> None:
        for cause in StopCause:
            value = getattr(self, cause.value)
            _need(value >= 0, f"budgets.{cause.value}", f"{value} is negative",
                  "set it to 0 (never restart) or a positive count")

    def limits(self) -> dict[StopCause, int]:
        return {cause: getattr(self, cause.value) for cause in StopCause}


@dataclass(frozen=True, kw_only=True)
class BackoffConfig:
    base_s: float = 2.0
    max_s: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        _need(_finite(self.base_s) and self.base_s >= 0, "backoff.base_s",
              f"{self.base_s} is not a non-negative number", "set it to seconds >= 0, e.g. 2")
        _need(_finite(self.max_s) and self.max_s >= self.base_s, "backoff.max_s",
              f"{self.max_s} is below backoff.base_s={self.base_s}",
              "set it >= controller.backoff.base_s")
        _need(_finite(self.multiplier) and self.multiplier >= 1, "backoff.multiplier",
              f"{self.multiplier} < 1 would shrink the delay", "set it >= 1, e.g. 2")
        _need(0 <= self.jitter <= 1, "backoff.jitter", f"{self.jitter} is not in [0, 1]",
              "set it to a fraction, e.g. 0.1 for ±10%")


@dataclass(frozen=True, kw_only=True)
class ElasticConfig:
    """Continue on fewer slices while replacements are missing; grow back at a checkpoint."""

    enabled: bool = True
    min_slices: int = 1
    shrink_after_s: float = 0.0
    grow_wait_for_checkpoint: bool = True
    min_resize_interval_s: float = 0.0

    def __post_init__(self) -> None:
        _need(self.min_slices >= 1, "elastic.min_slices", f"{self.min_slices} < 1",
              "set it to at least 1")
        _need(_finite(self.shrink_after_s) and self.shrink_after_s >= 0,
              "elastic.shrink_after_s", f"{self.shrink_after_s} is negative",
              "set it to seconds >= 0 (0 = shrink at once)")
        _need(_finite(self.min_resize_interval_s) and self.min_resize_interval_s >= 0,
              "elastic.min_resize_interval_s", f"{self.min_resize_interval_s} is negative",
              "set it to seconds >= 0")


@dataclass(frozen=True, kw_only=True)
class CheckpointIntervalConfig:
    """``fixed``: every ``every_steps``. ``young_daly``: adaptive in [min_steps, max_steps],
    starting at ``every_steps`` until step time and save cost are measured."""

    kind: Literal["fixed", "young_daly"] = "fixed"
    every_steps: int = 50
    min_steps: int = 10
    max_steps: int = 1000
    prior_mtbi_s: float = 3600.0
    prior_weight: float = 1.0

    def __post_init__(self) -> None:
        _need(self.every_steps >= 1, "checkpoint_interval.every_steps",
              f"{self.every_steps} < 1", "set it to a positive number of steps")
        if self.kind == "young_daly":
            _need(1 <= self.min_steps <= self.every_steps <= self.max_steps,
                  "checkpoint_interval.min_steps",
                  f"need 1 <= min_steps ({self.min_steps}) <= every_steps ({self.every_steps})"
                  f" <= max_steps ({self.max_steps})",
                  "order the bounds so every_steps lies between min_steps and max_steps")
        _need(_finite(self.prior_mtbi_s) and self.prior_mtbi_s > 0,
              "checkpoint_interval.prior_mtbi_s", f"{self.prior_mtbi_s} is not > 0",
              "set the expected seconds between interruptions, e.g. 3600")
        _need(_finite(self.prior_weight) and self.prior_weight > 0,
              "checkpoint_interval.prior_weight", f"{self.prior_weight} is not > 0",
              "set it > 0 (pseudo-interruptions behind the prior), e.g. 1")


@dataclass(frozen=True, kw_only=True)
class DeadlineConfig:
    save_if_time_left_factor: float = 1.5
    on_short_deadline: Literal["save_anyway", "fallback"] = "fallback"

    def __post_init__(self) -> None:
        _need(_finite(self.save_if_time_left_factor) and self.save_if_time_left_factor > 0,
              "deadline.save_if_time_left_factor", f"{self.save_if_time_left_factor} is not > 0",
              "set a safety factor on the expected save time, e.g. 1.5")


@dataclass(frozen=True, kw_only=True)
class HealthConfig:
    cordon_after: int = 3
    window_s: float = 300.0
    min_drain_interval_s: float = 60.0

    def __post_init__(self) -> None:
        _need(self.cordon_after >= 1, "health.cordon_after", f"{self.cordon_after} < 1",
              "set it to at least 1 (1 = cordon on the first unhealthy report)")
        _need(_finite(self.window_s) and self.window_s > 0, "health.window_s",
              f"{self.window_s} is not > 0", "set a window in seconds, e.g. 300")
        _need(_finite(self.min_drain_interval_s) and self.min_drain_interval_s >= 0,
              "health.min_drain_interval_s", f"{self.min_drain_interval_s} is negative",
              "set it to seconds >= 0")


@dataclass(frozen=True, kw_only=True)
class WarmConfig:
    """Warm re-forms: keep host processes between groups instead of starting them cold."""

    reuse_processes: Literal["auto", "on", "off"] = "auto"
    """A drained group's processes on hosts the next mesh keeps leave the JAX runtime in
    process and join the next one (no new process, no imports). ``auto``: on for the CPU
    platform, off on TPU (re-initialising the TPU runtime in one process is not verified
    there). A process that cannot be released or rejoined is replaced by a fresh one."""
    standby_slices: Literal["auto"] | int = "auto"
    """Spare slices whose hosts keep a warm standby process (JAX imported, no runtime): a
    re-form onto them skips the process start and the imports. ``auto`` (the default): every
    complete spare slice; a number caps them; 0 = none (the opt-out)."""
    preform: bool = True
    """Standbys that can hold the whole mesh (a one-slice job and its spare slice) join a JAX
    runtime of their own for it while the job trains, and build, load and run the step once:
    a move of the whole mesh there then only restores (``orchestrator/raygroup/preform.py``).
    Costs the spare hosts one copy of the state in device memory; false = standbys only."""
    handover_max_s: float = 20.0
    """On a notice that leaves time, training goes on (HANDING_OVER) for at most this long
    while the replacement hosts warm up, then drains; 0 = drain at once."""

    def __post_init__(self) -> None:
        _need(self.reuse_processes in ("auto", "on", "off"), "warm.reuse_processes",
              f"{self.reuse_processes!r} is not auto, on or off", "use auto, on or off")
        _need(self.standby_slices == "auto" or (isinstance(self.standby_slices, int)
                                                and self.standby_slices >= 0),
              "warm.standby_slices", f"{self.standby_slices!r} is not auto or a number >= 0",
              "set auto (every spare slice), a number of spare slices to keep warm, or 0 = none")
        _need(_finite(self.handover_max_s) and self.handover_max_s >= 0,
              "warm.handover_max_s", f"{self.handover_max_s} is not >= 0",
              "set seconds to train on while the replacement warms up, 0 = drain at once")

    def standby_count(self, spare: int) -> int:
        """How many of ``spare`` complete spare slices keep standby processes."""
        return spare if self.standby_slices == "auto" else min(spare, int(self.standby_slices))

    def reuse(self, platform: str) -> bool:
        return self.reuse_processes == "on" or (self.reuse_processes == "auto"
                                                and platform == "cpu")


@dataclass(frozen=True, kw_only=True)
class ChaosFaultConfig:
    """One injected fault: at step ``at_step`` on mesh host index ``host``."""

    at_step: int
    host: int
    kind: Literal["preempt", "kill", "hang", "unhealthy", "kill_in_save", "hang_init",
                  "crash_in_notice"]
    deadline_s: float = 30.0


@dataclass(frozen=True, kw_only=True)
class Policies:
    """Everything the controller decides with, built once from config."""

    classifier: StopClassifier
    budget: RestartBudgetPolicy
    placement: PlacementPolicy
    grow: GrowPolicy
    deadline: DeadlinePolicy
    save: SavePolicy
    reaction: ReactionPolicy
    resize: ResizePolicy
    chaos: FaultSchedule


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    budgets: BudgetsConfig = field(default_factory=BudgetsConfig)
    budget_window_s: float = 0.0
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    max_wait_for_capacity_s: float = 600.0
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    batch_on_resize: Literal["keep", "scale"] = "keep"
    lr_on_scale: Literal["linear", "sqrt", "none"] = "linear"
    checkpoint_interval: CheckpointIntervalConfig = field(default_factory=CheckpointIntervalConfig)
    deadline: DeadlineConfig = field(default_factory=DeadlineConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    warm: WarmConfig = field(default_factory=WarmConfig)
    chaos: tuple[ChaosFaultConfig, ...] = ()

    def __post_init__(self) -> None:
        _need(_finite(self.budget_window_s) and self.budget_window_s >= 0, "budget_window_s",
              f"{self.budget_window_s} is negative", "set it to seconds (0 = whole run)")
        _need(_finite(self.max_wait_for_capacity_s) and self.max_wait_for_capacity_s >= 0,
              "max_wait_for_capacity_s", f"{self.max_wait_for_capacity_s} is not >= 0",
              "set a bound in seconds, e.g. 600")
        _need(self.elastic.shrink_after_s <= self.max_wait_for_capacity_s,
              "elastic.shrink_after_s",
              f"{self.elastic.shrink_after_s} exceeds max_wait_for_capacity_s="
              f"{self.max_wait_for_capacity_s}, so the run would fail before it could shrink",
              "set it <= controller.max_wait_for_capacity_s")
        seen: set[tuple[int, int, str]] = set()
        for i, fault in enumerate(self.chaos):
            where = f"chaos[{i}]"
            _need(fault.at_step >= 0, f"{where}.at_step", f"{fault.at_step} is negative",
                  "set the step (>= 0) at which to inject the fault")
            _need(fault.host >= 0, f"{where}.host", f"{fault.host} is negative",
                  "set the mesh host index (0-based)")
            _need(_finite(fault.deadline_s) and fault.deadline_s >= 0, f"{where}.deadline_s",
                  f"{fault.deadline_s} is negative", "set the notice length in seconds")
            key = (fault.at_step, fault.host, fault.kind)
            _need(key not in seen, where, f"duplicate fault {key}",
                  "remove the duplicate entry (each (step, host, kind) fires once)")
            seen.add(key)

    def build_policies(self) -> Policies:
        """The pure policy objects this config describes."""
        ci = self.checkpoint_interval
        interval: SavePolicy
        if ci.kind == "fixed":
            interval = FixedInterval(every_steps=ci.every_steps)
        else:
            interval = YoungDaly(
                initial_every_steps=ci.every_steps, min_steps=ci.min_steps,
                max_steps=ci.max_steps, prior_mtbi_s=ci.prior_mtbi_s,
                prior_weight=ci.prior_weight,
            )
        health = HealthPolicy(
            cordon_after=self.health.cordon_after, window_s=self.health.window_s,
            min_drain_interval_s=self.health.min_drain_interval_s,
        )
        return Policies(
            classifier=StopClassifier(),
            budget=RestartBudgetPolicy(
                limits=self.budgets.limits(), window_s=self.budget_window_s,
                backoff_base_s=self.backoff.base_s, backoff_max_s=self.backoff.max_s,
                backoff_multiplier=self.backoff.multiplier, jitter=self.backoff.jitter,
            ),
            placement=PlacementPolicy(
                max_wait_s=self.max_wait_for_capacity_s, elastic=self.elastic.enabled,
                min_slices=self.elastic.min_slices, shrink_after_s=self.elastic.shrink_after_s,
            ),
            grow=GrowPolicy(
                enabled=self.elastic.enabled,
                wait_for_checkpoint=self.elastic.grow_wait_for_checkpoint,
                min_interval_s=self.elastic.min_resize_interval_s,
            ),
            deadline=DeadlinePolicy(
                save_if_time_left_factor=self.deadline.save_if_time_left_factor,
                on_short_deadline=self.deadline.on_short_deadline,
            ),
            save=interval,
            reaction=ReactionPolicy(health=health),
            resize=ResizePolicy(mode=BatchMode(self.batch_on_resize), lr_scaling=self.lr_on_scale),
            chaos=FaultSchedule(
                faults=tuple(
                    Fault(at_step=f.at_step, host=f.host, kind=FaultKind(f.kind),
                          deadline_s=f.deadline_s)
                    for f in self.chaos
                )
            ),
        )
