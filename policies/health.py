"""Cordon unhealthy hosts without letting a flapping host make the run thrash.

Rules, and why:
- ``cordon_after`` unhealthy reports for a host within ``window_s`` cordon it; a fatal report
  cordons at once. Healthy reports in between do NOT reset the count: that is the hysteresis
  that catches a flapping host (unhealthy, healthy, unhealthy, ...) instead of ignoring it.
- Cordoned is forever in this run: a host that flapped once will flap again, and re-admitting
  it would cost another drain.
- Health drains are at least ``min_drain_interval_s`` apart: a second host crossing the line
  right after a drain is cordoned at once (never placed on again) but its drain is deferred, so
  the controller can batch it with the next re-form instead of re-forming twice in a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, kw_only=True)
class HealthReport:
    """One health signal about a host (from an event, a Ray node state, a probe)."""

    host: str
    at: float
    healthy: bool
    fatal: bool = False


@dataclass(frozen=True, kw_only=True)
class HealthObservation:
    """The latest report's host, its report history (latest included), and run context."""

    now: float
    host: str
    reports: tuple[HealthReport, ...]
    cordoned: frozenset[str] = frozenset()
    in_mesh: bool = True
    last_health_drain_at: float | None = None

    @property
    def unhealthy_times(self) -> tuple[float, ...]:
        return tuple(r.at for r in self.reports if r.host == self.host and not r.healthy)

    @property
    def fatal(self) -> bool:
        return any(r.fatal and not r.healthy for r in self.reports if r.host == self.host)


class HealthKind(StrEnum):
    WATCH = "watch"
    ALREADY_CORDONED = "already_cordoned"
    CORDON = "cordon"
    CORDON_AND_DRAIN = "cordon_and_drain"
    CORDON_DRAIN_LATER = "cordon_drain_later"


@dataclass(frozen=True, kw_only=True)
class HealthDecision:
    """``cordon``: never place on ``host`` again. ``drain``: drain it now like a preemption.
    ``drain_not_before``: for CORDON_DRAIN_LATER, the earliest time to drain it."""

    kind: HealthKind
    host: str
    reason: str
    drain_not_before: float | None = None

    @property
    def cordon(self) -> bool:
        return self.kind in (
            HealthKind.CORDON, HealthKind.CORDON_AND_DRAIN, HealthKind.CORDON_DRAIN_LATER
        )

    @property
    def drain(self) -> bool:
        return self.kind is HealthKind.CORDON_AND_DRAIN


@dataclass(frozen=True, kw_only=True)
class HealthPolicy:
    cordon_after: int = 3
    window_s: float = 300.0
    min_drain_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.cordon_after < 1:
            raise ValueError("cordon_after must be >= 1")
        if self.window_s <= 0 or self.min_drain_interval_s < 0:
            raise ValueError("window_s must be > 0 and min_drain_interval_s >= 0")

    def decide(self, observation: HealthObservation) -> HealthDecision:
        obs = observation
        if obs.host in obs.cordoned:
            return HealthDecision(
                kind=HealthKind.ALREADY_CORDONED, host=obs.host,
                reason="cordoned earlier in this run",
            )
        recent = [t for t in obs.unhealthy_times if obs.now - self.window_s < t <= obs.now]
        if not obs.fatal and len(recent) < self.cordon_after:
            return HealthDecision(
                kind=HealthKind.WATCH, host=obs.host,
                reason=f"{len(recent)} of {self.cordon_after} unhealthy reports "
                f"within {self.window_s:g}s",
            )
        why = "fatal health report" if obs.fatal else (
            f"{len(recent)} unhealthy reports within {self.window_s:g}s "
            f"(controller.health.cordon_after={self.cordon_after})"
        )
        if not obs.in_mesh:
            return HealthDecision(
                kind=HealthKind.CORDON, host=obs.host, reason=f"{why}; not in mesh"
            )
        last = obs.last_health_drain_at
        if last is not None and obs.now - last < self.min_drain_interval_s:
            return HealthDecision(
                kind=HealthKind.CORDON_DRAIN_LATER, host=obs.host,
                drain_not_before=last + self.min_drain_interval_s,
                reason=f"{why}; last health drain {obs.now - last:.0f}s ago "
                f"(< controller.health.min_drain_interval_s={self.min_drain_interval_s:g})",
            )
        return HealthDecision(kind=HealthKind.CORDON_AND_DRAIN, host=obs.host, reason=why)
