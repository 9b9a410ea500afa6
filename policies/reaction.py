"""What the controller does about one event, given the mesh it runs on: one typed Reaction.

The intake says *what happened* and *which hosts it names* (``orchestrator.events.targeting``);
this policy says *what to do about it*. Rules, and why:

- An event naming no host of the run and not the job as a whole is IGNOREd with the reason.
- A job-wide preemption or maintenance notice dooms every mesh host: the next mesh must not be
  formed on hosts that are about to go (re-forming in place would only be drained again).
- ``host_lost`` / ``slice_lost`` announced by a source drain now without the named hosts; deaths
  Ray reports are the controller's failure path, not this policy.
- Scheduled maintenance comes days ahead. Draining at once costs the same re-form as draining
  just before the window, but waiting is free if the run ends first or the window moves, so the
  drain is placed at the step that lands ``maintenance_lead_s`` before the window starts.
  ``maintenance_lead_s`` (600 s) covers drift in the step-time estimate over a long wait plus
  one blocking save and a re-form; the 60 s metadata notice that precedes the window itself is
  far too short for a large save, which is why we act on the scheduled notice at all.
- Live migration, alerts and resume are NOTEd only: a live migration keeps the VM running, so
  draining with an invented deadline would cost a re-form for nothing.
- ``host_unhealthy`` composes ``HealthPolicy`` (hysteresis, cordon forever, rate-limited drains).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from policies.causes import EVENT_KIND_CAUSES, StopCause
from policies.health import HealthKind, HealthObservation, HealthPolicy, HealthReport

# The cause of each stop comes from the one event-kind table the failure classifier uses.
_HEALTH = EVENT_KIND_CAUSES["host_unhealthy"]


class ReactionKind(StrEnum):
    DRAIN_NOW = "drain_now"          # next step boundary: save if time allows, re-form w/o doomed
    DRAIN_AT_STEP = "drain_at_step"  # same, at `at_step` (scheduled maintenance days ahead)
    CORDON_AND_REPLACE = "cordon_and_replace"  # never place on `cordon` again; drain `doomed` now
    STOP = "stop"                    # operator stop: save and end the run
    NOTE = "note"                    # record only (live migration, alerts, resume, low health)
    IGNORE = "ignore"                # not for this run; `reason` says why


# Precedence when two pending reactions merge: the stronger one decides kind and cause.
_RANK = {
    ReactionKind.IGNORE: 0,
    ReactionKind.NOTE: 1,
    ReactionKind.DRAIN_AT_STEP: 2,
    ReactionKind.DRAIN_NOW: 3,
    ReactionKind.CORDON_AND_REPLACE: 4,
    ReactionKind.STOP: 5,
}
_DRAINS = (ReactionKind.DRAIN_NOW, ReactionKind.DRAIN_AT_STEP, ReactionKind.CORDON_AND_REPLACE)


@dataclass(frozen=True, kw_only=True)
class ReactionObservation:
    """Plain facts about one event and the run at the moment it is handled.

    ``targets``: node ids the event names (``resolve_targets``); ``mesh_hosts``: node ids in the
    current mesh (empty while none is formed); ``job_hosts``: the hosts the job holds or held
    last (the last mesh's), which a job-wide notice dooms while no mesh is formed.
    ``health_reports`` should include the report this event carries; when it holds no unhealthy
    report for a target, the event counts as one non-fatal unhealthy report at ``now``.
    """

    now: float
    kind: str
    targets: frozenset[str]
    job_wide: bool
    mesh_hosts: frozenset[str]
    job_hosts: frozenset[str] = frozenset()
    deadline: float | None = None
    window_start: float | None = None
    window_end: float | None = None
    step: int = 0
    step_time_s: float | None = None
    expected_save_s: float | None = None
    health_reports: tuple[HealthReport, ...] = ()
    cordoned: frozenset[str] = frozenset()
    last_health_drain_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class Reaction:
    """The decision. ``doomed``: node ids to leave out of the next mesh (on a NOTE: hosts the
    event names outside the current mesh, advisory). ``cordon``: never place on again.
    ``deadline``: what the drain must meet. ``not_before``: a health drain rate-limited by
    ``HealthPolicy.min_drain_interval_s`` should start no earlier (batch it with any drain due
    sooner). A CORDON_AND_REPLACE with empty ``doomed`` cordons only (the host is not in the
    mesh): nothing to drain."""

    kind: ReactionKind
    reason: str
    cause: StopCause | None = None
    doomed: frozenset[str] = frozenset()
    cordon: frozenset[str] = frozenset()
    at_step: int | None = None
    deadline: float | None = None
    not_before: float | None = None

    @property
    def drains(self) -> bool:
        """True if the controller must stop the mesh (now or at ``at_step``)."""
        if self.kind is ReactionKind.STOP:
            return True
        if self.kind is ReactionKind.CORDON_AND_REPLACE:
            return bool(self.doomed)
        return self.kind in (ReactionKind.DRAIN_NOW, ReactionKind.DRAIN_AT_STEP)


@dataclass(frozen=True, kw_only=True)
class ReactionPolicy:
    health: HealthPolicy = field(default_factory=HealthPolicy)
    maintenance_lead_s: float = 600.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.maintenance_lead_s) or self.maintenance_lead_s < 0:
            raise ValueError("maintenance_lead_s must be a finite number of seconds >= 0 "
                             "(how long before a maintenance window the drain should land)")

    def decide(self, obs: ReactionObservation) -> Reaction:
        """One reaction for one event; never raises for an unknown kind (it is NOTEd)."""
        kind = obs.kind.strip().lower()
        if not obs.targets and not obs.job_wide:
            return Reaction(kind=ReactionKind.IGNORE,
                            reason=f"{kind} names no host of this run and not the job")
        if kind == "operator_stop":
            return Reaction(kind=ReactionKind.STOP, reason="stop requested by operator",
                            cause=EVENT_KIND_CAUSES[kind], deadline=obs.deadline)
        if kind in ("operator_resume", "alert_firing", "alert_resolved", "live_migration"):
            why = ("live migration keeps the VM running; nothing to drain"
                   if kind == "live_migration" else "no driver action for this kind")
            return Reaction(kind=ReactionKind.NOTE, reason=f"{kind}: {why}")
        if kind == "host_unhealthy":
            return self._health(obs)
        if kind == "operator_drain":
            return self._drain(obs, EVENT_KIND_CAUSES[kind], "drain requested by operator",
                               doomed=frozenset(obs.targets), deadline=obs.deadline)
        if kind in ("host_lost", "slice_lost"):
            return self._drain(obs, EVENT_KIND_CAUSES[kind], f"{kind} announced",
                               doomed=self._doomed(obs), deadline=obs.deadline)
        if kind == "preemption_notice":
            return self._drain(obs, EVENT_KIND_CAUSES[kind], "preemption notice",
                               doomed=self._doomed(obs), deadline=obs.deadline)
        if kind == "maintenance_scheduled":
            return self._maintenance(obs)
        return Reaction(kind=ReactionKind.NOTE, reason=f"unknown event kind {kind!r}: noted only")

    def revise_drain_step(self, *, at_step: int, deadline: float, now: float, step: int,
                          step_time_s: float | None, expected_save_s: float | None) -> int:
        """The drain step chosen hours ahead, pulled earlier when the steps have run slower than
        the estimate it was chosen with: the drain (and its save) must still land
        ``maintenance_lead_s`` before the window. Never later than ``at_step``."""
        st = step_time_s
        if st is None or not math.isfinite(st) or st <= 0 or at_step <= step:
            return at_step
        save = expected_save_s if expected_save_s and expected_save_s > 0 else 0.0
        budget = deadline - now - self.maintenance_lead_s - save
        latest = step + (math.floor(budget / st) if budget > 0 else 0)
        return max(step, min(at_step, latest))

    # ---- rules ------------------------------------------------------------------------------

    @staticmethod
    def _doomed(obs: ReactionObservation) -> frozenset[str]:
        """All the job's hosts for a job-wide notice (the mesh's, else the last mesh's), else
        the named hosts."""
        if obs.job_wide:
            return frozenset(obs.mesh_hosts or obs.job_hosts)
        return frozenset(obs.targets)

    @staticmethod
    def _drain(obs: ReactionObservation, cause: StopCause, why: str, *,
               doomed: frozenset[str], deadline: float | None,
               at_step: int | None = None) -> Reaction:
        """A drain, unless the named hosts are all outside a formed mesh (then only noted)."""
        if obs.job_wide and not obs.mesh_hosts and cause is not StopCause.OPERATOR:
            if at_step is not None:  # a drain planned ahead (a window days away): the hosts
                # are fine until then; decide it again on the next mesh
                return Reaction(kind=ReactionKind.NOTE, cause=cause, deadline=deadline,
                                reason=f"{why} for the whole job while no mesh is formed: "
                                "decided again on the next mesh")
            # between meshes (backoff, waiting): the job's last hosts are the ones going
            return Reaction(kind=ReactionKind.NOTE, cause=cause, doomed=doomed,
                            reason=f"{why} for the whole job while no mesh is formed: "
                            + ("keep its last hosts out of the next mesh" if doomed
                               else "nothing to drain"))
        if obs.mesh_hosts and doomed and not doomed & obs.mesh_hosts:
            return Reaction(kind=ReactionKind.NOTE, cause=cause, doomed=doomed,
                            reason=f"{why} for hosts outside the current mesh: "
                            "keep them out of the next mesh")
        where = "the whole job" if obs.job_wide else f"{len(doomed)} host(s)"
        if at_step is not None:
            return Reaction(kind=ReactionKind.DRAIN_AT_STEP, cause=cause, doomed=doomed,
                            at_step=at_step, deadline=deadline,
                            reason=f"{why} for {where}: drain at step {at_step}")
        return Reaction(kind=ReactionKind.DRAIN_NOW, cause=cause, doomed=doomed,
                        deadline=deadline, reason=f"{why} for {where}: drain now")

    def _maintenance(self, obs: ReactionObservation) -> Reaction:
        start = obs.window_start if obs.window_start is not None else obs.deadline
        doomed = self._doomed(obs)
        cause = EVENT_KIND_CAUSES["maintenance_scheduled"]
        if obs.window_end is not None and obs.now >= obs.window_end:
            return Reaction(kind=ReactionKind.NOTE, cause=cause,
                            reason="maintenance window already ended; a host it took is "
                            "handled as lost")
        if start is None:
            return self._drain(obs, cause, "maintenance with no window start",
                               doomed=doomed, deadline=None)
        left = start - obs.now
        if left <= self.maintenance_lead_s:
            why = ("maintenance window started" if left <= 0 else
                   f"maintenance window in {left:.0f}s (<= maintenance_lead_s="
                   f"{self.maintenance_lead_s:g})")
            return self._drain(obs, cause, why, doomed=doomed, deadline=start)
        st = obs.step_time_s
        if st is None or not math.isfinite(st) or st <= 0:
            return Reaction(kind=ReactionKind.NOTE, cause=cause, doomed=doomed,
                            deadline=start,
                            reason=f"maintenance window in {left:.0f}s: waiting for a step "
                            "time to choose the drain step")
        save = obs.expected_save_s if obs.expected_save_s and obs.expected_save_s > 0 else 0.0
        budget = left - self.maintenance_lead_s - save
        steps_ahead = math.floor(budget / st) if budget > 0 else 0
        why = f"maintenance window in {left:.0f}s"
        if steps_ahead < 1:
            return self._drain(obs, cause, f"{why}, less than a step to spare",
                               doomed=doomed, deadline=start)
        return self._drain(obs, cause, f"{why} (step {st:g}s, save {save:g}s, lead "
                           f"{self.maintenance_lead_s:g}s)", doomed=doomed,
                           deadline=start, at_step=obs.step + steps_ahead)

    def _health(self, obs: ReactionObservation) -> Reaction:
        if obs.job_wide and not obs.targets:
            return Reaction(kind=ReactionKind.NOTE, cause=_HEALTH,
                            reason="health report names no host: cannot cordon the whole job")
        cordon: set[str] = set()
        doomed: set[str] = set()
        later: list[float] = []
        reasons: list[str] = []
        for host in sorted(obs.targets):
            reports = obs.health_reports
            if not any(r.host == host and not r.healthy for r in reports):
                reports = (*reports, HealthReport(host=host, at=obs.now, healthy=False))
            decision = self.health.decide(HealthObservation(
                now=obs.now, host=host, reports=reports,
                cordoned=obs.cordoned | frozenset(cordon),
                in_mesh=host in obs.mesh_hosts,
                last_health_drain_at=obs.last_health_drain_at))
            reasons.append(f"{host}: {decision.reason}")
            if decision.cordon:
                cordon.add(host)
            if decision.kind in (HealthKind.CORDON_AND_DRAIN, HealthKind.CORDON_DRAIN_LATER):
                doomed.add(host)
            if decision.kind is HealthKind.CORDON_DRAIN_LATER and decision.drain_not_before:
                later.append(decision.drain_not_before)
        why = "; ".join(reasons)
        if not cordon:
            return Reaction(kind=ReactionKind.NOTE, cause=_HEALTH, reason=why)
        # A host draining now carries the deferred ones with it (one re-form, not two).
        deferred = bool(later) and len(later) == len(doomed)
        return Reaction(kind=ReactionKind.CORDON_AND_REPLACE, cause=_HEALTH,
                        cordon=frozenset(cordon), doomed=frozenset(doomed),
                        deadline=obs.deadline,
                        not_before=min(later) if deferred else None,
                        reason=why)


def _rank(r: Reaction) -> float:
    """A cordon-only reaction (nothing to drain) ranks between a note and any drain."""
    if r.kind is ReactionKind.CORDON_AND_REPLACE and not r.doomed:
        return 1.5
    return _RANK[r.kind]


def merge(a: Reaction, b: Reaction) -> Reaction:
    """Two pending reactions as one: the stronger kind (STOP > cordon-and-drain > drain now >
    drain at step > cordon only > note > ignore) and its cause; union of doomed and cordon
    (``cordon`` holds whatever the kind); the earliest deadline and at_step of the drains. A
    drain due now absorbs a deferred one (``not_before`` kept only if every drain defers)."""
    strong, weak = (a, b) if _rank(a) >= _rank(b) else (b, a)
    kind = strong.kind
    if kind is ReactionKind.DRAIN_AT_STEP and weak.drains and weak.at_step is None:
        kind = ReactionKind.DRAIN_NOW
    steps = [r.at_step for r in (a, b) if r.at_step is not None and r.drains]
    at_step = min(steps) if kind is ReactionKind.DRAIN_AT_STEP and steps else None
    drains = [r for r in (a, b) if r.drains] or [a, b]
    deadlines = [r.deadline for r in drains if r.deadline is not None]
    deferred = [r.not_before for r in drains if r.not_before is not None]
    not_before = min(deferred) if deferred and len(deferred) == len(drains) else None
    reason = strong.reason if weak.kind is ReactionKind.IGNORE else (
        f"{strong.reason}; merged with: {weak.reason}")
    return replace(strong, kind=kind, reason=reason, cause=strong.cause or weak.cause,
                   doomed=a.doomed | b.doomed, cordon=a.cordon | b.cordon, at_step=at_step,
                   deadline=min(deadlines) if deadlines else None, not_before=not_before)
