"""DRAINING and CHECKPOINTING: the group stopped at one step boundary; save if there is time,
then finish (target reached), stop (operator, SIGTERM) or release for a re-form.

A stop always saves from the devices (durable, never RAM-first: the run ends, and what ends it,
a pod deletion say, may take the RAM tier's holders too) and never falls back: its old
checkpoint stays whatever happens to the save. Each drain's outcome (saved, drained) is recorded
for the events behind it (``Reactions.settle``) once it took effect."""

from __future__ import annotations

import dataclasses

from orchestrator.controller import recovering
from orchestrator.controller.context import Next, Run, log
from orchestrator.controller.seam import GroupFailed, RamCopies
from orchestrator.lifecycle import Checkpointing, Releasing, RunState
from policies.preemption import DrainKind, DrainObservation
from policies.ram_tier import peer_nodes

S = RunState

DEFAULT_SAVE_S = 2.0  # before the first measured save
DEFAULT_COPY_S = 0.5  # before the first measured RAM-tier copy


def draining(run: Run) -> Next:
    p = run.pending
    assert p is not None
    now = run.now()
    led = run.ledger
    ram = run.cfg.checkpoint.ram
    # else durable saves only: no tier, or one whose copies go down with the doomed nodes
    has_ram = (ram.enabled is True and isinstance(run.group, RamCopies)
               and copies_survive(run, p.doomed))
    decision = run.policies.deadline.decide(DrainObservation(
        now=now, deadline=p.deadline if p.deadline is not None else now + 3600.0,
        expected_save_s=led.median_save_s() or DEFAULT_SAVE_S, expected_step_s=0.0,
        step=led.step, last_committed_step=led.last_committed,
        expected_copy_s=(led.median_copy_s() or DEFAULT_COPY_S) if has_ram else None))
    if p.deadline is None:  # a drain nobody set a deadline for (a grow, an operator's): the
        # policy was asked with an hour ahead, which its reason would read as time left
        decision = dataclasses.replace(
            decision, reason=f"no deadline: {decision.kind.value.replace('_', ' ')}")
    log.info("drain_decision", kind=decision.kind.value, reason=decision.reason, step=led.step,
             event_id=p.event_id)
    run.reactions.record(p.event or p.event_id, f"drain:{decision.kind.value}", outcome=False,
                         reason=decision.reason, step=led.step)
    kind = decision.kind
    if p.stop and kind in (DrainKind.FALL_BACK_TO_LAST_CHECKPOINT, DrainKind.RAM_COPY_ONLY):
        kind = DrainKind.SAVE_ANYWAY  # the run ends: only a durable save can keep these steps
    if (kind is DrainKind.SAVE and not p.final and not p.stop and has_ram
            and ram.durable_from_ram):
        return Next(S.CHECKPOINTING, f"{decision.reason}; handing over in RAM, the durable "
                    "copy is written from it after the switch", Checkpointing(purpose=RAM_FIRST))
    if kind in (DrainKind.SAVE, DrainKind.SAVE_ANYWAY):
        return Next(S.CHECKPOINTING, decision.reason, Checkpointing(
            purpose="stop" if p.stop else "drain", save_anyway=kind is DrainKind.SAVE_ANYWAY))
    if kind is DrainKind.RAM_COPY_ONLY:
        return Next(S.CHECKPOINTING, decision.reason, Checkpointing(purpose=RAM_ONLY))
    saved = kind is DrainKind.NOTHING_TO_SAVE
    run.reactions.settle(p, "saved" if saved else "drained", step=led.step,
                         committed_step=led.last_committed, lost_steps=decision.lost_steps)
    return Next(S.RELEASING, decision.reason, Releasing(
        cause=p.cause, lost_steps=decision.lost_steps, estimated=bool(decision.lost_steps)))


def copies_survive(run: Run, doomed: frozenset[str]) -> bool:
    """Whether every host's RAM copy has a holder off the doomed slices: its own node's or its
    peer's (``policies.ram_tier.peer_nodes``: another slice's host, or a standby's on a spare
    slice; ``checkpoint.ram.holders: peer``: the peer's only). A slice goes as a unit (a notice
    for one of its hosts takes them all): in a one-slice mesh with no standby a host's peer is
    in the same slice, a notice dooms both holders of every copy, and only a durable save keeps
    the step."""
    plan = run.plan
    if plan is None or not doomed:
        return True
    spare = run.placement.standby
    slice_of = {h.node_id: h.slice_name for h in (*plan.hosts, *spare)}
    gone = {h.slice_name for h in plan.hosts if h.node_id in doomed}
    peer = peer_nodes([(h.slice_name, h.node_id) for h in plan.hosts],
                      [(h.slice_name, h.node_id) for h in spare])
    peer_only = run.cfg.checkpoint.ram.holders == "peer"
    return all(not held(h.slice_name, None if n is None else slice_of[n], peer_only) <= gone
               for h, n in zip(plan.hosts, peer, strict=True))


def held(own: str, peer: str | None, peer_only: bool) -> set[str]:
    """The slices holding a host's copy (``ram_holders.assignments``)."""
    if peer is None:
        return {own}
    return {peer} if peer_only else {own, peer}


RAM_ONLY = "drain-ram-only"
RAM_FIRST = "drain-ram-then-durable"


def checkpointing(run: Run) -> Next:
    group, p = run.group, run.pending
    assert group is not None and p is not None
    payload = run.lifecycle.payload
    if isinstance(payload, Checkpointing) and payload.purpose == RAM_ONLY:
        return _copy_to_ram(run)
    if isinstance(payload, Checkpointing) and payload.purpose == RAM_FIRST:
        out = _copy_to_ram(run, persist=True)
        if out is not None:
            return out
        log.warning("drain_ram_copy_incomplete", fallback="durable save from the devices")
    try:
        saved = group.save()
    except GroupFailed as exc:
        return recovering.after_failure(run, exc.status)
    run.ledger.save_costs.append(saved.save_s)
    run.ledger.committed(saved.committed_step)
    r = run.ledger.open_recovery
    if r is not None:
        r.saved_step, r.save_s = saved.committed_step, round(saved.save_s, 3)
    if not p.final:
        run.reactions.settle(p, "saved", step=saved.committed_step, tier="durable")
    if p.final:
        run.listeners.notify("on_final_group", group)
        run.teardown(graceful=True)
        run.pending = None
        return Next(S.SUCCEEDED, f"reached step {run.ledger.step}")
    return Next(S.RELEASING, f"checkpoint at step {saved.committed_step} committed",
                Releasing(cause=p.cause, lost_steps=0))


def _copy_to_ram(run: Run, *, persist: bool = False) -> Next | None:
    """A short notice: every host copies the stopped step to its holders and waits for them;
    the durable tier is not written (the reason says so), the restore will read RAM.
    ``persist``: the holders write it durably after the switch; None if a copy is incomplete
    (the caller saves from the devices instead)."""
    group, p = run.group, run.pending
    assert isinstance(group, RamCopies) and p is not None  # DRAINING chose RAM only if so
    try:
        copied = group.copy_to_ram(persist=persist)
    except GroupFailed as exc:
        return recovering.after_failure(run, exc.status)
    if persist and not copied.complete:
        return None
    run.ledger.copy_costs.append(copied.save_s)
    run.ledger.ram_copied(copied.step)
    run.reactions.settle(p, "saved", step=copied.step, tier="ram+persist" if persist else "ram")
    r = run.ledger.open_recovery
    if r is not None:
        r.save_s = round(copied.save_s, 3)
    if persist:
        log.info("drain_ram_then_durable", step=copied.step, copy_s=round(copied.save_s, 3))
        return Next(S.RELEASING, f"step {copied.step} copied to the peer hosts' RAM; their "
                                 "holders write it durably in the background",
                    Releasing(cause=p.cause, lost_steps=0))
    log.warning("drain_ram_only", step=copied.step, copy_s=round(copied.save_s, 3),
                durable_step=run.ledger.last_committed)
    return Next(S.RELEASING, f"step {copied.step} copied to the peer hosts' RAM only (no "
                             f"durable copy; durable step {run.ledger.last_committed})",
                Releasing(cause=p.cause, lost_steps=0))
