"""When to save periodically: a fixed interval, the Young/Daly optimum from interruptions, a
wall-clock interval, or any combination of them (``any_of``).

``SavePolicy`` is an open protocol (anything with ``decide``), so an embedding program can pass
its own rule to the controller without this module knowing it.

Young/Daly: with save cost C and mean time between interruptions M, the interval that minimises
expected lost work plus save overhead is about sqrt(2·C·M) (first-order, valid for C << M). The
MTBI is estimated as the posterior mean of an exponential rate with a gamma prior: ``prior_weight``
pseudo-interruptions spread over ``prior_weight * prior_mtbi_s`` seconds, plus what the run saw.
A young run therefore follows the prior and moves toward the observed rate as evidence grows.
The save a drain makes is not decided here: ``policies.preemption.DeadlinePolicy`` weighs it
against the notice's deadline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, kw_only=True)
class SaveObservation:
    """Progress and measurements at a step boundary (driver clock, seconds).

    ``interruptions``: how many interruptions that lose work the run has seen over
    ``observed_s`` seconds of wall time: the unannounced ones. An announced one is drained and
    its step saved, so it loses nothing the periodic saves could have kept (Young/Daly weighs
    the work a failure throws away against the saves' cost); counting it would save more often
    for nothing. ``save_cost_s`` / ``step_time_s``: observed means, None until measured.
    """

    step: int
    last_save_step: int | None
    now: float = 0.0
    step_time_s: float | None = None
    save_cost_s: float | None = None
    interruptions: int = 0
    observed_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SaveDecision:
    """``save`` plus why; ``interval_steps``: the interval in force (None if not interval-based)."""

    save: bool
    reason: str
    interval_steps: int | None = None


def _steps_since(obs: SaveObservation) -> int:
    return obs.step - (obs.last_save_step if obs.last_save_step is not None else 0)


def _already_saved(obs: SaveObservation) -> bool:
    return obs.last_save_step is not None and obs.last_save_step >= obs.step


@dataclass(frozen=True, kw_only=True)
class FixedInterval:
    """Save every ``every_steps`` steps (at steps that are multiples of it)."""

    every_steps: int

    def __post_init__(self) -> None:
        if self.every_steps < 1:
            raise ValueError("every_steps must be >= 1")

    def decide(self, observation: SaveObservation) -> SaveDecision:
        obs = observation
        if _already_saved(obs) or obs.step <= 0:
            return SaveDecision(save=False, reason="already saved", interval_steps=self.every_steps)
        if obs.step % self.every_steps == 0 or _steps_since(obs) >= self.every_steps:
            return SaveDecision(
                save=True, reason=f"every {self.every_steps} steps", interval_steps=self.every_steps
            )
        return SaveDecision(save=False, reason="not due", interval_steps=self.every_steps)


@dataclass(frozen=True, kw_only=True)
class YoungDaly:
    """Adaptive interval sqrt(2·save_cost·MTBI), converted to steps, clamped to [min, max].

    Before step time and save cost are measured, ``initial_every_steps`` applies.
    """

    initial_every_steps: int
    min_steps: int
    max_steps: int
    prior_mtbi_s: float = 3600.0
    prior_weight: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.initial_every_steps <= self.max_steps:
            raise ValueError("need 1 <= min_steps <= initial_every_steps <= max_steps")
        if self.prior_mtbi_s <= 0 or self.prior_weight <= 0:
            raise ValueError("prior_mtbi_s and prior_weight must be > 0")

    def mtbi_s(self, interruptions: int, observed_s: float) -> float:
        """Posterior mean time between interruptions (seconds)."""
        return (self.prior_weight * self.prior_mtbi_s + max(0.0, observed_s)) / (
            self.prior_weight + max(0, interruptions)
        )

    def interval_steps(self, observation: SaveObservation) -> int:
        obs = observation
        if not obs.step_time_s or obs.step_time_s <= 0 or obs.save_cost_s is None:
            return self.initial_every_steps
        seconds = math.sqrt(2.0 * max(0.0, obs.save_cost_s) * self.mtbi_s(
            obs.interruptions, obs.observed_s))
        steps = round(seconds / obs.step_time_s)
        return max(self.min_steps, min(self.max_steps, steps))

    def decide(self, observation: SaveObservation) -> SaveDecision:
        obs = observation
        every = self.interval_steps(obs)
        if _already_saved(obs) or obs.step <= 0:
            return SaveDecision(save=False, reason="already saved", interval_steps=every)
        if _steps_since(obs) >= every:
            return SaveDecision(
                save=True, reason=f"young/daly interval {every} steps", interval_steps=every
            )
        return SaveDecision(save=False, reason="not due", interval_steps=every)


@dataclass(frozen=True, kw_only=True)
class EverySeconds:
    """Save every ``seconds`` of training: the interval in steps follows the measured step time
    (none until it is measured: ``any_of`` then goes by its other rules)."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError("seconds must be > 0")

    def decide(self, observation: SaveObservation) -> SaveDecision:
        obs = observation
        if not obs.step_time_s or obs.step_time_s <= 0:
            return SaveDecision(save=False, reason="step time not measured yet")
        every = max(1, round(self.seconds / obs.step_time_s))
        if _already_saved(obs) or obs.step <= 0:
            return SaveDecision(save=False, reason="already saved", interval_steps=every)
        if _steps_since(obs) >= every:
            return SaveDecision(save=True, reason=f"every {self.seconds:g}s ({every} steps)",
                                interval_steps=every)
        return SaveDecision(save=False, reason="not due", interval_steps=every)


class SavePolicy(Protocol):
    """Any rule that decides periodic saves; the controller reads ``interval_steps`` to place
    save steps (multiples of it) and falls back to ``every_steps`` when it is None."""

    def decide(self, observation: SaveObservation) -> SaveDecision: ...


@dataclass(frozen=True)
class AnyOf:
    """Save when any rule says so: the interval in force is the shortest any rule gives."""

    policies: tuple[SavePolicy, ...]

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("any_of needs at least one policy")

    def decide(self, observation: SaveObservation) -> SaveDecision:
        decisions = [p.decide(observation) for p in self.policies]
        due = [d.reason for d in decisions if d.save]
        intervals = [d.interval_steps for d in decisions if d.interval_steps is not None]
        return SaveDecision(save=bool(due), reason="; ".join(due) or "not due",
                            interval_steps=min(intervals, default=None))


def every_steps(n: int) -> FixedInterval:
    return FixedInterval(every_steps=n)


def every_seconds(seconds: float) -> EverySeconds:
    return EverySeconds(seconds=seconds)


def any_of(*policies: SavePolicy) -> AnyOf:
    """``any_of(every_steps(500), every_seconds(1800))``: whichever comes first."""
    return AnyOf(tuple(policies))
