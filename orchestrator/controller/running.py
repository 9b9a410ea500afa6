"""RUNNING: chunks of steps while listening for events, until the target, a drain or a failure.

The driver owns checkpoint steps: the save policy chooses the interval and the driver passes the
exact steps to save at; the hosts report which step has *committed*. A drain asks the hosts to
stop at the next step boundary (a stop flag read between steps), so it waits about one step,
not the rest of a chunk.
"""

from __future__ import annotations

import dataclasses

from orchestrator.controller import ahead, copies, handover, recovering
from orchestrator.controller.context import Next, Pending, Run, log
from orchestrator.controller.planning import complete_slices, usable_hosts
from orchestrator.controller.seam import Hung, Progress, Running
from orchestrator.lifecycle import Checkpointing, Draining, RunState
from policies.causes import StopCause
from policies.checkpoint_interval import SaveObservation
from policies.preemption import GrowKind, GrowObservation

S = RunState


def running(run: Run) -> Next:
    total = run.cfg.run.total_steps
    while True:
        step = run.ledger.step
        if step >= total:
            run.pending = Pending(cause=StopCause.OPERATOR, reason="target reached",
                                  stop=True, final=True)
            return Next(S.CHECKPOINTING, f"reached step {total}: final save",
                        Checkpointing(purpose="final"))
        run.reactions.poll(in_mesh=True)
        if _drain_due(run):
            return _drain_or_handover(run)
        every = save_interval(run)
        until = chunk_end(run, every)
        save_steps = [s for s in range(step + 1, until + 1) if s % every == 0]
        run.listeners.notify("before_chunk", run, step, until)
        run.reactions.poll(in_mesh=True)  # what the plug-ins just sent acts at this boundary
        if _drain_due(run):
            return _drain_or_handover(run)
        run.chunk += 1
        assert run.group is not None
        run.group.start_chunk(until, chunk=run.chunk, save_steps=save_steps,
                              copy_every=copies.copy_every(run, every))
        status = _wait_chunk(run, steps=until - step + eval_batches(run, step, until))
        if not isinstance(status, Progress):
            return recovering.after_failure(run, status)
        _absorb(run, status)
        _finish_recovery(run, status)
        _check_grow(run)
        ahead.guarded(run)


def eval_batches(run: Run, step: int, until: int) -> int:
    """Eval batches the hosts run in steps ``step+1 .. until`` (``eval.every``): each is
    bounded like a step (a forward pass of a batch costs less than a step)."""
    ev = run.cfg.eval
    if not ev.every:
        return 0
    return (until // ev.every - step // ev.every) * ev.batches


def save_interval(run: Run) -> int:
    """Steps between periodic saves, from the save policy (``policies.checkpoint_interval``:
    any rule, or ``any_of`` several; the configured interval when it gives none)."""
    led = run.ledger
    now = run.now()
    decision = run.policies.save.decide(SaveObservation(
        step=led.step, last_save_step=led.last_committed, now=now,
        step_time_s=led.median_step_s(), save_cost_s=led.median_save_s(),
        interruptions=sum(not r.announced for r in led.restarts),
        observed_s=now - run.started_at))
    return max(1, decision.interval_steps or run.ctl.checkpoint_interval.every_steps)


def chunk_end(run: Run, every: int) -> int:
    """The step this chunk runs to: about ``steps_per_call`` steps (1 s of steps when 0), ending
    on a save step (a grow waits for a committed step at a chunk boundary), never past a drain's
    chosen step or a plug-in's (chaos) step."""
    step = run.ledger.step
    per_call = run.cfg.run.steps_per_call
    if not per_call:
        st = run.ledger.median_step_s(10) or 0.2
        per_call = max(1, min(100, int(1.0 / max(st, 1e-3))))
    until = min(run.cfg.run.total_steps, step + per_call, (step // every + 1) * every)
    revise_drain_step(run)
    if run.pending is not None and run.pending.at_step is not None and run.pending.at_step > step:
        until = min(until, run.pending.at_step)
    until = run.listeners.chunk_end(run, step, until)
    return max(step + 1, until)


def revise_drain_step(run: Run) -> None:
    """A drain step chosen long before its deadline (maintenance days ahead) follows the step
    time actually observed since: pulled earlier, never later (policies.reaction)."""
    p = run.pending
    if p is None or p.at_step is None or p.deadline is None:
        return
    led = run.ledger
    revised = run.policies.reaction.revise_drain_step(
        at_step=p.at_step, deadline=p.deadline, now=run.now(), step=led.step,
        step_time_s=led.median_step_s(), expected_save_s=led.median_save_s())
    if revised < p.at_step:
        log.info("drain_step_revised", event_id=p.event_id, was=p.at_step, now=revised)
        run.pending = dataclasses.replace(p, at_step=revised)


def _drain_due(run: Run) -> bool:
    """A stop (operator, SIGTERM) is due at once; a drain at its step, after any handover."""
    p = run.pending
    return (p is not None and (p.stop or (
        (p.at_step is None or run.ledger.step >= p.at_step)
        and (p.handover_until is None or handover.drain_now(run)))))


def _drain_or_handover(run: Run) -> Next:
    if run.lifecycle.state is S.RUNNING:
        nxt = handover.begin(run)
        if nxt is not None:
            return nxt
    return _enter_drain(run)


def _wait_chunk(run: Run, *, steps: int):
    """Poll the chunk, reacting to events; a due drain raises the hosts' stop flag. Bounded by
    ``steps × timeouts.step_s`` of the run's clock."""
    group = run.group
    assert group is not None
    bound = run.cfg.timeouts.step_s * max(1, steps)
    deadline = run.now() + bound
    stop_sent = False
    while True:
        status = group.poll(run.poll_interval_s)
        if not isinstance(status, Running):
            return status
        run.reactions.poll(in_mesh=True)
        if not stop_sent and _drain_due(run):
            group.request_stop(run.chunk)
            stop_sent = True
        if run.now() > deadline:
            return group.name_hung(Hung(phase="step", hosts=status.pending, seconds=bound))


def _absorb(run: Run, status: Progress) -> None:
    led = run.ledger
    led.absorb(status.step, status.committed_step, status.records)
    if run.listeners.wants("on_step") or run.listeners.wants("on_eval"):
        for rec in status.records:
            _report(run, rec)


def _report(run: Run, rec: dict) -> None:
    """Host 0's raw record of one step as a ``StepRecord`` (MFU against the resolved peak) and
    its eval, if any, to the listeners; a malformed record is logged and skipped."""
    from orchestrator.controller.records import EvalRecord, StepRecord

    plan, cfg = run.plan, run.placement.mesh_cfg
    assert plan is not None and cfg is not None
    tokens = run.tokens if run.tokens is not None \
        else cfg.train.global_batch * (cfg.model.seq_len - 1)
    try:
        step = StepRecord.build(
            step=rec["step"], loss=rec["loss"], step_time_s=rec["step_time_s"], tokens=tokens,
            flops=run.flops or 0.0, grad_norm=rec["grad_norm"], wall_time=rec["wall_time"],
            devices=plan.devices, peak=run.peak or (0.0, "unknown"),
            incarnation=run.ledger.incarnation, slices=plan.num_slices,
            checkpoint_blocking_s=rec["checkpoint_blocking_s"], lr=rec["lr"],
            ram_copy_s=float(rec.get("ram_copy_s", 0.0)), metrics=rec.get("metrics"))
        run.listeners.notify("on_step", step)
        if rec.get("eval"):  # host 0 evaluated after this step (eval.every)
            run.listeners.notify("on_eval", EvalRecord.from_host(rec["step"], rec["eval"]))
    except Exception as exc:  # a malformed record must not stop the run
        log.error("step_record_invalid", step=rec.get("step"), error=repr(exc))


def _finish_recovery(run: Run, status: Progress) -> None:
    """Close the open recovery at its first productive step: host 0's record of the chunk's
    first step says when it ended (the driver hears of it only at the chunk's end)."""
    r = run.ledger.open_recovery
    if r is None:
        return
    t0 = r.boundary_at or r.started_at
    ends = [float(x["wall_time"]) for x in status.records if x.get("wall_time") is not None]
    first = min(ends) if ends else None
    phases: dict[str, float] = {}
    for t in run.lifecycle.timeline:
        if t.at >= t0 and t.prev is not None and t.prev not in (S.RUNNING, S.HANDING_OVER):
            phases[t.prev.value] = round(phases.get(t.prev.value, 0.0) + t.prev_duration_s, 3)
    now = run.now()
    done = run.ledger.close_recovery(
        now=first if first is not None and t0 <= first <= now else now, phases_s=phases)
    if done is not None:
        log.info("recovered", **{k: v for k, v in done.to_json().items() if k != "phases_s"},
                 phases=phases)


def _check_grow(run: Run) -> None:
    p = run.placement
    plan = p.plan
    assert plan is not None
    if run.pending is not None or plan.num_slices >= p.target_slices:
        return
    current = set(plan.slice_names)
    spare = [s for s in complete_slices(usable_hosts(run), plan.hosts_per_slice)
             if s not in current]
    decision = run.policies.grow.decide(GrowObservation(
        now=run.now(), current_slices=plan.slice_names, spare_slices=tuple(spare),
        target_slices=p.target_slices, step=run.ledger.step,
        last_committed_step=run.ledger.last_committed, last_resize_at=p.last_resize_at,
        save_started_step=run.ledger.save_started))
    if decision.kind is GrowKind.HOLD:
        return
    log.info("grow", reason=decision.reason, slices=list(decision.slices))
    run.pending = Pending(cause=StopCause.OPERATOR, reason=decision.reason,
                          event_id=f"grow-{run.ledger.step}", regrow=True)


def _enter_drain(run: Run) -> Next:
    p = run.pending
    assert p is not None
    if p.regrow:
        run.ledger.open_grow(reason=p.reason, event_id=p.event_id, now=run.now())
    elif not p.final:
        r = run.ledger.open_announced(cause=p.cause, event_id=p.event_id,
                                      noticed_at=p.noticed_at or run.now(), now=run.now())
        if p.handover_started is not None:
            r.handover, r.handover_s = p.handover, round(run.now() - p.handover_started, 3)
    reason = f"{p.reason} (handover: {p.handover})" if p.handover else p.reason
    return Next(S.DRAINING, reason, Draining(
        event_id=p.event_id, deadline=p.deadline, doomed_hosts=tuple(sorted(p.doomed)),
        cause=p.cause))
