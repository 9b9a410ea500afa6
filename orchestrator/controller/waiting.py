"""WAITING_FOR_CAPACITY: too few complete slices to form on; wait (bounded by the placement
policy's deadline) for capacity to return, reacting to events and stops meanwhile, then plan
again (PLANNING decides whether to form, shrink or give up)."""

from __future__ import annotations

from orchestrator.controller import stopping
from orchestrator.controller.context import Next, Run
from orchestrator.controller.planning import complete_slices, usable_hosts
from orchestrator.lifecycle import Planning, RunState, WaitingForCapacity

S = RunState


def waiting(run: Run) -> Next:
    """Wait (bounded) until enough complete slices are back, reacting to events meanwhile."""
    payload = run.lifecycle.payload
    deadline = payload.deadline if isinstance(payload, WaitingForCapacity) else run.now()
    p = run.placement
    while run.now() < deadline:
        run.reactions.poll(in_mesh=False)
        stop = stopping.stop_requested(run)
        if stop is not None:
            return stop
        if len(complete_slices(usable_hosts(run), p.hosts_per_slice or 1)) >= p.target_slices:
            return Next(S.PLANNING, "capacity returned", Planning())  # no new restart
        run.clock.sleep(0.5)
    return Next(S.PLANNING, "wait bound reached", Planning())
