"""Stopping on an operator's request or SIGTERM: a stop that arrives while no group runs ends the
run at once (one with a group running drains and saves first: ``running`` → ``draining``).

Every phase that waits without a group (PLANNING, WAITING_FOR_CAPACITY, BACKOFF, RELEASING)
asks ``stop_requested`` before going on, so a stop is never ignored for lack of work to save.
SIGTERM reaches the controller as a flag the driver's handler set (``Run.stop_request``);
``take_signal`` turns it into a pending stop at the next poll, merged into a drain under way.
"""

from __future__ import annotations

import dataclasses

from orchestrator.controller.context import Next, Pending, Run, log
from orchestrator.lifecycle import Releasing, RunState, Stopped
from policies.causes import StopCause

S = RunState


def take_signal(run: Run) -> None:
    """A SIGTERM the driver received becomes a pending stop (once): drain at the next step
    boundary, save, end the run. A drain already pending keeps its doomed hosts and saves too."""
    if run.stop_request is None or run.stopping_by is not None:
        return
    try:
        req = run.stop_request()
    except Exception as exc:  # a broken embedding must not stop the run by accident
        log.error("stop_request_failed", error=repr(exc))
        return
    if req is None:
        return
    run.stopping_by = req
    reason = f"{req.signal} received: stop at the next step boundary after saving it"
    log.warning("stop_signal", signal=req.signal, grace_s=req.grace_s, step=run.ledger.step,
                expected_drain_s=_expected_drain_s(run), state=run.lifecycle.state.value)
    p = run.pending
    if p is not None and p.final:
        return  # the final save is under way: the run ends with it
    if p is None:
        run.pending = Pending(cause=StopCause.OPERATOR, reason=reason, event_id=req.signal,
                              stop=True, noticed_at=run.now())
    else:
        run.pending = dataclasses.replace(p, stop=True, reason=f"{p.reason}; {reason}")


def stop_before_training(run: Run) -> Next | None:
    """A stop that came while the group was brought up (FORMING, RESTORING): when the restore
    holds nothing past the durable checkpoint, there is nothing to save, so the group is
    released now instead of compiling (minutes on a TPU without stored executables) and
    running a step only to drain it. A restore from the RAM tier past that checkpoint goes on
    to RUNNING, whose drain saves it durably."""
    take_signal(run)
    p = run.pending
    if p is None or not p.stop or p.final:
        return None
    led = run.ledger
    if led.step != (led.last_committed or 0):
        return None
    return Next(S.RELEASING, f"{p.reason.split(':')[0]} before the group trained: nothing new "
                f"to save", Releasing(cause=p.cause, lost_steps=0))


def _expected_drain_s(run: Run) -> float | None:
    """One step plus one save, from what this run measured (None before either is known)."""
    st, save = run.ledger.median_step_s(), run.ledger.median_save_s()
    return None if st is None or save is None else round(st + save, 3)


def stop_requested(run: Run) -> Next | None:
    """An operator stop (or SIGTERM) that arrived while no group runs ends the run at once:
    STOPPED, not FAILED (it did what it was asked; the summary counts any unsaved steps)."""
    take_signal(run)
    p = run.pending
    if p is None or not p.stop:
        return None
    step = run.ledger.last_committed
    by = run.stopping_by
    if by is not None and step is not None and step == run.ledger.step:
        reason = f"stopped by {by.signal} after saving step {step} (checkpoint committed)"
    else:
        what = f"stopped by {by.signal}" if by is not None else f"{p.reason}; the run stopped"
        reason = what + (f", checkpoint at step {step} is intact" if step is not None else "")
    run.reactions.settle(p, "stopped", step=step)
    return Next(S.STOPPED, reason, Stopped(reason=reason,
                                          by=by.signal if by is not None else "operator"))
