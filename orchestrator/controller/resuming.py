"""A driver that resumes a run dir an earlier driver left (killed, stopped, resubmitted by hand
or by autoresume): the resume is a recovery like any re-form, so ``recoveries`` is never empty
for a run that was restarted. What the earlier driver's timeline says of its end tells a death
(its last line a working state) from an end (a terminal state, then a resubmission)."""

from __future__ import annotations

from orchestrator.controller.context import Run, log
from orchestrator.lifecycle import TIMELINE_FILE, RunState
from orchestrator.shared.files import read_jsonl

DRIVER_DIED = "driver_died"
"""The earlier driver's last line is a working state: it was killed or lost its node."""
DRIVER_ENDED = "driver_ended"
"""It ended (stopped, failed, gave up) and the run was submitted again."""
CHECKPOINT_FOUND = "checkpoint_found"
"""No earlier timeline in this run dir, but a checkpoint to resume from."""

_TAIL_BYTES = 64 * 1024
_STATES = frozenset(s.value for s in RunState)


def note_resume(run: Run, *, restored_step: int | None) -> None:
    """At this driver's first restore: open a ``driver_restart`` recovery when an earlier
    driver worked in this run dir or a checkpoint is there to resume from."""
    if run.ledger.restores:  # not this driver's first restore
        return
    previous = earlier_driver(run)
    if previous is None and restored_step is None:
        return  # a fresh run
    cause = (CHECKPOINT_FOUND if previous is None else
             DRIVER_ENDED if previous["ended"] else DRIVER_DIED)
    run.ledger.open_resumed(cause=cause, started_at=run.started_at,
                            recorded_upto=run.ledger.recorded_upto, previous=previous)
    log.info("resumed", cause=cause, previous_driver=previous, restored_step=restored_step)


def earlier_driver(run: Run) -> dict | None:
    """The last timeline line an earlier driver wrote here: its state, step and time, and
    whether that state ``ended`` the run; None when there is none or it cannot be read."""
    first = run.lifecycle.timeline[0].seq
    last: dict | None = None
    try:
        for line in read_jsonl(run.run_dir / TIMELINE_FILE, tail_bytes=_TAIL_BYTES):
            seq = line.get("seq")
            if isinstance(seq, int) and seq < first and line.get("state") in _STATES:
                last = line
    except OSError as exc:
        log.warning("timeline_unreadable", error=str(exc))
        return None
    if last is None:
        return None
    state = RunState(last["state"])
    return {"state": state.value, "step": last.get("step"), "at": last.get("at"),
            "ended": state.terminal}
