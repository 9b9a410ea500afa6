"""Failures, RELEASING and BACKOFF: from "the group cannot go on" back to PLANNING.

``after_failure`` is the one place an unannounced failure is classified (the seam's closed
``FailureKind`` → the stop cause the budgets count); RELEASING tears the group down and asks the
restart budget whether and when to try again.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.controller import stopping
from orchestrator.controller.context import Next, Pending, Run, log
from orchestrator.controller.seam import (
    CorruptCheckpoint,
    Failure,
    Fatal,
    HostsLost,
    Hung,
    describe,
)
from orchestrator.lifecycle import Backoff, Failed, Planning, Releasing, RunState
from orchestrator.shared.files import atomic_write_text
from policies.causes import FailureKind, StopCause, StopObservation
from policies.restart_budget import GiveUp, RestartObservation, RestartRecord

S = RunState


def classify(run: Run, status: Failure, *, noticed: str | None = None) -> StopCause:
    """``noticed``: the kind of a pending notice the failure fulfils (it wins, as events do)."""
    kind = (FailureKind.HUNG if isinstance(status, Hung) else
            FailureKind.CHECKPOINT_CORRUPT if isinstance(status, CorruptCheckpoint) else
            status.kind)
    return run.policies.classifier.decide(
        StopObservation(event_kind=noticed, failure=kind, message=describe(status))).cause


# A host the cloud takes at its notice's deadline is seen dead a little later: the step in
# flight fails on its collectives, Ray's health checks miss a few beats.
DEATH_SEEN_AFTER_DEADLINE_S = 60.0


def noticed_death(run: Run, status: Failure) -> str | None:
    """The event kind of the pending preemption or maintenance notice whose doomed hosts are
    exactly the ones that died, inside its window or up to a minute after its deadline while
    its drain had not completed (no step boundary in time, a save running past it): spot hosts
    do crash inside their notice window, and the cloud takes them at the deadline; that death
    is the preemption (its budget, no backoff), not a host failure."""
    p = run.pending
    if (not isinstance(status, HostsLost) or p is None or p.stop or p.event is None
            or run.plan is None or p.deadline is None
            or run.now() > p.deadline + DEATH_SEEN_AFTER_DEADLINE_S
            or p.cause not in (StopCause.SPOT_PREEMPTION, StopCause.MAINTENANCE)):
        return None
    hosts = run.plan.hosts
    dead = {hosts[i].node_id for i in status.hosts if 0 <= i < len(hosts)}
    dead |= set(status.nodes_gone)
    return p.event.kind.value if dead and dead <= set(p.doomed) else None


def after_failure(run: Run, status: Failure) -> Next:
    """The group failed in some phase: record it, exclude what is gone, go to RELEASING (or
    FAILED for an error no retry can fix)."""
    if isinstance(status, Fatal):
        log.error("run_failed", error=status.message, hosts=list(status.hosts))
        return Next(S.FAILED, status.message, Failed(reason=status.message, cause=None))
    noticed = noticed_death(run, status)
    cause = classify(run, status, noticed=noticed)
    message = describe(status)
    log.warning("group_failed", cause=cause.value, error=message,
                hosts=list(getattr(status, "hosts", ())))
    if isinstance(status, Hung):
        _dump_stacks(run, status.phase)
    if isinstance(status, CorruptCheckpoint):
        run.placement.skip_steps.add(status.step)
    if isinstance(status, HostsLost):
        if status.step_reached is not None:
            run.ledger.reached(status.step_reached)
        run.placement.excluded |= set(status.nodes_gone)
        if run.plan is not None:
            run.placement.suspect = {run.plan.hosts[i].slice_name for i in status.hosts
                                     if 0 <= i < len(run.plan.hosts)}
    _record_losses(run, status)
    run.reactions.collect_notices()
    run.ledger.open_unannounced(cause=cause, error=message, now=run.now())
    prev = run.pending
    # an operator stop still ends it; a final save that failed is recovered and done again
    keep_stop = prev is not None and prev.stop and not prev.final
    if prev is not None and not prev.stop and prev.event is not None:
        # a notice not drained yet (a maintenance window hours ahead, a preemption due) must
        # outlive this failure: its hosts stay out if imminent, else it is decided again on
        # the next mesh
        run.reactions.carry_over(prev, fulfilled=noticed is not None)
    run.pending = Pending(cause=cause, reason=message, announced=False, stop=keep_stop)
    committed = run.ledger.last_committed or 0
    lost = max(0, run.ledger.max_step_reached - committed)
    return Next(S.RELEASING, f"{cause.value}: {message}",
                Releasing(cause=cause, lost_steps=lost, estimated=True))


def releasing(run: Run) -> Next:
    pending = run.pending
    announced = pending is not None and pending.announced
    # a re-form follows (unless stopping): the seam may keep the processes it can warm
    run.teardown(graceful=announced, keep_processes=not (pending and pending.stop),
                 doomed=pending.doomed if pending else ())
    if pending is None:  # defensive: RELEASING is entered only with a reason
        pending = Pending(cause=StopCause.HOST_LOST, reason="group released", announced=False)
    run.placement.excluded |= set(pending.doomed)
    run.pending = None
    if pending.stop:
        run.pending = pending
        return stopping.stop_requested(run)
    if pending.regrow:
        return Next(S.PLANNING, "re-forming on more slices", Planning(grow=True))
    now = run.now()
    decision = run.policies.budget.decide(RestartObservation(
        cause=pending.cause, now=now, history=tuple(run.ledger.restarts),
        hot_spare=bool(run.placement.suspect and run.placement.standby)))
    if isinstance(decision, GiveUp):
        return Next(S.FAILED, decision.reason, Failed(reason=decision.reason,
                                                      cause=pending.cause))
    # a drain that fell back to the last checkpoint lost work like a failure (Young/Daly)
    payload = run.lifecycle.payload
    lossless = announced and isinstance(payload, Releasing) and not payload.lost_steps
    run.ledger.restarts.append(RestartRecord(cause=pending.cause, at=now, announced=lossless))
    if decision.delay_s <= 0:
        return Next(S.PLANNING, f"re-forming after {pending.cause.value}: {pending.reason}",
                    Planning(cause=pending.cause))
    return Next(S.BACKOFF, f"backing off {decision.delay_s:.1f}s after {pending.cause.value}",
                Backoff(until=decision.until, cause=pending.cause, attempt=decision.attempt))


def backoff(run: Run) -> Next:
    payload = run.lifecycle.payload
    backoff_of = payload if isinstance(payload, Backoff) else None
    until = backoff_of.until if backoff_of else run.now()
    while run.now() < until:
        run.reactions.poll(in_mesh=False)
        stop = stopping.stop_requested(run)
        if stop is not None:
            return stop
        run.clock.sleep(min(0.2, max(0.0, until - run.now())))
    # the re-form the backoff delayed starts now: it carries the cause the budget counted
    return Next(S.PLANNING, "backoff over",
                Planning(cause=backoff_of.cause if backoff_of else None))


def _record_losses(run: Run, status: Failure) -> None:
    """Ray as an event source: each lost host is a HOST_LOST record in the event log."""
    if run.reactions is None or not isinstance(status, HostsLost) or run.plan is None:
        return
    for i in status.hosts:
        if 0 <= i < len(run.plan.hosts):
            run.reactions.record_host_lost(run.plan.hosts[i], status)


def _dump_stacks(run: Run, phase: str) -> None:
    if run.group is None:
        return
    try:
        d = Path(run.run_dir) / "diagnostics"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"stacks-{phase}-inc{run.ledger.incarnation}-{int(run.now())}.txt"
        stacks = run.group.stacks()
        atomic_write_text(path, "\n".join(f"===== host {i}\n{s}" for i, s in stacks.items()))
        log.warning("diagnostics_written", path=str(path), phase=phase)
    except Exception as exc:  # diagnostics are best effort
        log.error("diagnostics_failed", error=str(exc))
