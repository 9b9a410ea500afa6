"""DRAINING for a grow back: the run re-forms on more slices at a committed step. A grow has
no notice and so no deadline; the drain is decided as for any drain (``draining.draining``:
the deadline policy is asked with a placeholder deadline an hour ahead), and its reason, which
would read that placeholder as time left ("3600.0s left >= 3.0s needed"), is replaced by what
the grow does."""

from __future__ import annotations

import dataclasses

from orchestrator.controller import draining as drain
from orchestrator.controller.context import Next, Pending, Run
from orchestrator.lifecycle import Checkpointing, RunState

S = RunState


def draining(run: Run) -> Next:
    """``draining.draining``; for a grow, with a reason that says it is a planned grow."""
    p = run.pending
    nxt = drain.draining(run)
    if p is None or not p.regrow or nxt.state not in (S.CHECKPOINTING, S.RELEASING):
        return nxt
    payload = nxt.payload
    if isinstance(payload, Checkpointing) and payload.purpose == "drain":
        payload = dataclasses.replace(payload, purpose="grow")  # the timeline says why it saves
    return Next(nxt.state, grow_reason(p, nxt, run.ledger.step), payload)


def grow_reason(p: Pending, nxt: Next, step: int) -> str:
    """What a grow's drain does next, from the state and payload the drain chose."""
    head = f"{p.reason}: a planned grow, no deadline"
    if nxt.state is S.RELEASING:
        return f"{head}; step {step} is already committed, re-forming"
    purpose = nxt.payload.purpose if isinstance(nxt.payload, Checkpointing) else ""
    if purpose == drain.RAM_FIRST:
        return (f"{head}; step {step} handed over in RAM, the durable copy is written from it "
                "after the switch")
    return f"{head}; saving step {step}, then re-forming"
