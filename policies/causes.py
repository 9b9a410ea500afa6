"""Why the run stopped, classified once at the boundary into a closed set.

Each cause has its own retry budget (``restart_budget.py``), so a crash-looping program cannot
spend the budget meant for spot preemptions, and a stream of preemptions cannot exhaust the
budget meant for bugs. Classification uses plain facts (the event kind, the seam's closed set of
failure kinds), never Ray types, so it runs in tests and a fleet simulator without a cluster.

Why seven causes and not five:
- ``TIMEOUT``: a bounded phase (distributed init, compile, restore, step) passed its bound. It is
  neither a known hardware fault nor a deterministic bug; it is often transient (a slow host, a
  host that never joined) but a run that times out on every attempt has a config problem, so it
  gets a small budget of its own instead of eating the preemption budget.
- ``HOST_LOST``: a host or its actor vanished without notice (node removed, ``kill -9``, spot
  preemption whose notice we missed). Calling it a preemption would make a host that crashes
  every few minutes look like bad luck; calling it a hardware fault would cordon hosts that were
  simply reclaimed. It gets its own budget and backoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FailureKind(StrEnum):
    """What the worker-group seam saw go wrong, in a closed set (no Ray types): the only input
    the controller gives the classifier for an unannounced stop."""

    ACTOR_DIED = "actor_died"  # a host process is gone (kill -9, OOM kill, crash)
    ACTOR_UNAVAILABLE = "actor_unavailable"  # a host cannot be reached (node going away)
    NODE_DIED = "node_died"  # the host's Ray node (VM) is gone
    SLICE_LOST = "slice_lost"  # a whole slice went away
    HUNG = "hung"  # a bounded phase passed its bound (init, compile, restore, step, save)
    STEP_ERROR = "step_error"  # the step (or a phase call) raised in a live host: a bug
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"  # the chosen checkpoint could not be read


class StopCause(StrEnum):
    """Closed set of reasons the JAX group stopped. Values double as config keys."""

    SPOT_PREEMPTION = "spot_preemption"
    MAINTENANCE = "maintenance"
    HARDWARE_HEALTH = "hardware_health"
    HOST_LOST = "host_lost"
    TIMEOUT = "timeout"
    APPLICATION_ERROR = "application_error"
    OPERATOR = "operator"
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"
    """The checkpoint chosen to restore could not be read: the re-form falls back a step."""

    @property
    def announced(self) -> bool:
        """True if the cause comes with a notice, so the group can drain and save first."""
        return self in _ANNOUNCED

    @property
    def cordons_host(self) -> bool:
        """True if the hosts involved must never be placed on again in this run."""
        return self is StopCause.HARDWARE_HEALTH


_ANNOUNCED = frozenset(
    {
        StopCause.SPOT_PREEMPTION,
        StopCause.MAINTENANCE,
        StopCause.HARDWARE_HEALTH,
        StopCause.OPERATOR,
    }
)

# Event kinds (lower-cased) and the cause each one means: the intake's EventKind values
# (orchestrator/events/model.py) first, then short aliases used by chaos and the CLI.
EVENT_KIND_CAUSES: dict[str, StopCause] = {
    "preemption_notice": StopCause.SPOT_PREEMPTION,
    "maintenance_scheduled": StopCause.MAINTENANCE,
    "host_unhealthy": StopCause.HARDWARE_HEALTH,
    "host_lost": StopCause.HOST_LOST,
    "slice_lost": StopCause.HOST_LOST,
    "operator_drain": StopCause.OPERATOR,
    "operator_stop": StopCause.OPERATOR,
    "preemption": StopCause.SPOT_PREEMPTION,
    "preempted": StopCause.SPOT_PREEMPTION,
    "spot_preemption": StopCause.SPOT_PREEMPTION,
    "preempt": StopCause.SPOT_PREEMPTION,
    "maintenance": StopCause.MAINTENANCE,
    "maintenance_event": StopCause.MAINTENANCE,
    "termination": StopCause.MAINTENANCE,
    "health": StopCause.HARDWARE_HEALTH,
    "unhealthy": StopCause.HARDWARE_HEALTH,
    "node_health": StopCause.HARDWARE_HEALTH,
    "hardware": StopCause.HARDWARE_HEALTH,
    "operator": StopCause.OPERATOR,
    "drain": StopCause.OPERATOR,
    "stop": StopCause.OPERATOR,
    "cancel": StopCause.OPERATOR,
    "resize": StopCause.OPERATOR,
    "node_died": StopCause.HOST_LOST,
    "actor_died": StopCause.HOST_LOST,
    "kill": StopCause.HOST_LOST,
    "hang": StopCause.TIMEOUT,
}

FAILURE_KIND_CAUSES: dict[FailureKind, StopCause] = {
    FailureKind.ACTOR_DIED: StopCause.HOST_LOST,
    FailureKind.ACTOR_UNAVAILABLE: StopCause.HOST_LOST,
    FailureKind.NODE_DIED: StopCause.HOST_LOST,
    FailureKind.SLICE_LOST: StopCause.HOST_LOST,
    FailureKind.HUNG: StopCause.TIMEOUT,
    FailureKind.STEP_ERROR: StopCause.APPLICATION_ERROR,
    # The restore falls back to an older step: neither a host's nor the application's fault,
    # so it spends a budget of its own (bounded: a disk that corrupts every checkpoint).
    FailureKind.CHECKPOINT_CORRUPT: StopCause.CHECKPOINT_CORRUPT,
}

@dataclass(frozen=True, kw_only=True)
class StopObservation:
    """Plain facts about one stop, gathered by the controller at the boundary.

    ``event_kind`` is set when an event (notice, operator command) caused the stop; ``failure``
    is what the worker-group seam saw go wrong
    (``orchestrator.raygroup.results.failure_kind`` is the one place a Ray exception becomes a
    ``FailureKind``).
    """

    event_kind: str | None = None
    failure: FailureKind | None = None
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class Classification:
    """The cause plus a one-line explanation of how it was derived (goes into the timeline)."""

    cause: StopCause
    reason: str


@dataclass(frozen=True, kw_only=True)
class StopClassifier:
    """Maps a StopObservation to a StopCause. Events win over failures: a notice explains the
    failure that follows it (the doomed host's actor dies after the notice)."""

    event_kinds: tuple[tuple[str, StopCause], ...] = tuple(EVENT_KIND_CAUSES.items())

    def decide(self, observation: StopObservation) -> Classification:
        """Classify one stop; unknown facts fall back to APPLICATION_ERROR (smallest budget)."""
        kinds = dict(self.event_kinds)
        obs = observation
        if obs.event_kind:
            kind = obs.event_kind.strip().lower()
            if kind in kinds:
                return Classification(cause=kinds[kind], reason=f"event kind {obs.event_kind!r}")
        if obs.failure is not None:
            return Classification(cause=FAILURE_KIND_CAUSES[obs.failure],
                                  reason=f"failure {obs.failure.value}")
        return Classification(
            cause=StopCause.APPLICATION_ERROR, reason="no known event or failure: assumed a bug"
        )


def classify(observation: StopObservation) -> Classification:
    """Classify with the default tables."""
    return _DEFAULT.decide(observation)


_DEFAULT = StopClassifier()
