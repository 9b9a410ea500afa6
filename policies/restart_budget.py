"""Separate retry budgets per stop cause, with exponential backoff for unannounced ones.

Why per cause: a run on spot capacity may be preempted dozens of times and should keep going,
while a deterministic bug should stop after a few attempts with the checkpoint intact. Why no
backoff for announced causes: the drain already saved, the wait for new capacity is bounded
separately (WAITING_FOR_CAPACITY), and sleeping would only add badput.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.causes import StopCause


@dataclass(frozen=True, kw_only=True)
class RestartRecord:
    """One earlier restart: its cause and when it happened (driver clock, seconds)."""

    cause: StopCause
    at: float
    announced: bool = False
    """Drained on a notice with its step saved: it lost no work (a drain that fell back to
    the last checkpoint is not)."""


@dataclass(frozen=True, kw_only=True)
class RestartObservation:
    """A stop to decide on: its cause, the time, earlier restarts, and a random draw in [0, 1).

    ``jitter_draw`` is passed in (not drawn here) so decisions are reproducible in tests.
    """

    cause: StopCause
    now: float
    history: tuple[RestartRecord, ...] = ()
    jitter_draw: float = 0.5
    hot_spare: bool = False
    """A warm standby takes the failed hosts' place: the first attempt goes at once (backoff
    protects a cluster from a crash loop; a standby re-form is not that)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter_draw < 1.0:
            raise ValueError(f"jitter_draw must be in [0, 1), got {self.jitter_draw}")


@dataclass(frozen=True, kw_only=True)
class Restart:
    """Go again. ``delay_s`` == 0 means go straight to PLANNING (no BACKOFF state)."""

    cause: StopCause
    attempt: int
    delay_s: float
    until: float


@dataclass(frozen=True, kw_only=True)
class GiveUp:
    """Budget exhausted: the run ends FAILED with ``reason``; ``setting`` is what to raise."""

    cause: StopCause
    count: int
    limit: int
    reason: str
    setting: str


RestartDecision = Restart | GiveUp


@dataclass(frozen=True, kw_only=True)
class RestartBudgetPolicy:
    """``limits[cause]`` restarts per cause (within ``window_s`` if > 0, else per run).

    Backoff for unannounced causes: ``base_s * multiplier**(attempt-1)`` capped at ``max_s``,
    then spread by ``± jitter`` (a fraction) using the observation's draw, capped again.
    """

    limits: Mapping[StopCause, int] = field(default_factory=dict)
    window_s: float = 0.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.0
    backoff_announced: bool = False
    setting_prefix: str = "controller.budgets"

    def __post_init__(self) -> None:
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_max_s")
        if self.backoff_multiplier < 1.0:
            raise ValueError("backoff_multiplier must be >= 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be in [0, 1]")
        if self.window_s < 0:
            raise ValueError("window_s must be >= 0")

    def count(self, cause: StopCause, now: float, history: tuple[RestartRecord, ...]) -> int:
        """Earlier restarts of ``cause`` that still count against its budget at ``now``."""
        return sum(
            1
            for r in history
            if r.cause is cause and (self.window_s <= 0 or now - r.at < self.window_s)
        )

    def backoff_s(self, cause: StopCause, attempt: int, jitter_draw: float) -> float:
        """Delay before attempt number ``attempt`` (1-based) of ``cause``."""
        if cause.announced and not self.backoff_announced:
            return 0.0
        raw = self.backoff_base_s * self.backoff_multiplier ** min(attempt - 1, 64)
        raw = min(self.backoff_max_s, raw)
        spread = 1.0 + self.jitter * (2.0 * jitter_draw - 1.0)
        return max(0.0, min(self.backoff_max_s, raw * spread))

    def decide(self, observation: RestartObservation) -> RestartDecision:
        """Restart with a delay, or give up naming the cause, the count and the setting."""
        obs = observation
        limit = self.limits.get(obs.cause, 0)
        used = self.count(obs.cause, obs.now, obs.history)
        setting = f"{self.setting_prefix}.{obs.cause.value}"
        if used >= limit:
            span = f" within {self.window_s:g}s" if self.window_s > 0 else " in this run"
            return GiveUp(
                cause=obs.cause,
                count=used + 1,
                limit=limit,
                reason=(
                    f"{obs.cause.value} stop #{used + 1}{span} exceeds the budget of {limit} "
                    f"restarts; raise {setting} to allow more"
                ),
                setting=setting,
            )
        attempt = used + 1
        delay = (0.0 if obs.hot_spare and attempt == 1 else
                 self.backoff_s(obs.cause, attempt, obs.jitter_draw))
        return Restart(cause=obs.cause, attempt=attempt, delay_s=delay, until=obs.now + delay)
