"""Stopping on an operator's request: a stop that arrives while no group runs ends the run at
once (one with a group running drains and saves first: ``running`` → ``draining``).

Every phase that waits without a group (PLANNING, WAITING_FOR_CAPACITY, BACKOFF, RELEASING)
asks ``stop_requested`` before going on, so a stop is never ignored for lack of work to save.
"""

from __future__ import annotations

from orchestrator.controller.context import Next, Run
from orchestrator.lifecycle import Failed, RunState
from policies.causes import StopCause

S = RunState


def stop_requested(run: Run) -> Next | None:
    """An operator stop that arrived while no group runs ends the run at once."""
    p = run.pending
    if p is None or not p.stop:
        return None
    step = run.ledger.last_committed
    reason = f"{p.reason}; the run stopped" + (
        f", checkpoint at step {step} is intact" if step is not None else "")
    return Next(S.FAILED, reason, Failed(reason=reason, cause=StopCause.OPERATOR))
