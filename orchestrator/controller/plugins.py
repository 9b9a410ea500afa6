"""Plug-ins that act on the run at fixed points, without branches in the core loop.

A plug-in is a ``RunListener`` (``controller.listener``) that overrides the chunk-boundary
callbacks; ``ChaosPlugin`` pairs the pure fault schedule (``policies.chaos``) with the seam
calls that inject each fault, keyed by (host, step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.controller.context import log
from orchestrator.controller.listener import RunListener
from orchestrator.controller.seam import InjectsFaults
from policies.chaos import CRASH_IN_NOTICE_AFTER_S, NOTICE_KINDS, Fault, FaultKind, FaultSchedule

if TYPE_CHECKING:
    from orchestrator.controller.context import Run


class ChaosPlugin(RunListener):
    """Deterministic faults from ``controller.chaos``; each fires once (a fall-back restore
    passes the same step again, and firing there again would loop forever)."""

    def __init__(self, schedule: FaultSchedule) -> None:
        self.schedule = schedule
        self.fired: set[tuple[int, int, str]] = set()

    def init_faults(self, run: Run) -> list[tuple[int, dict]]:
        plan = run.plan
        out = []
        for f in self.schedule.faults:
            if (f.kind is FaultKind.HANG_INIT and f.key not in self.fired
                    and f.at_step <= run.ledger.step and plan and f.host < len(plan.hosts)):
                self.fired.add(f.key)
                log.info("chaos_armed", kind=f.kind.value, host=f.host, step=f.at_step)
                out.append((f.host, _fault_dict(f)))
        return out

    def chunk_end(self, run: Run, step: int, until: int) -> int:
        for f in self.schedule.faults:
            if f.kind is not FaultKind.HANG_INIT and f.key not in self.fired \
                    and step < f.at_step < until:
                until = f.at_step
        return until

    def before_chunk(self, run: Run, step: int, until: int) -> None:
        group, plan = run.group, run.plan
        if group is None or plan is None:
            return
        for f in self.schedule.faults:
            if f.key in self.fired or f.host >= len(plan.hosts):
                continue
            in_actor = ((f.kind in (FaultKind.KILL, FaultKind.HANG) and step <= f.at_step < until)
                        or (f.kind is FaultKind.KILL_IN_SAVE and step < f.at_step <= until))
            if in_actor:
                self.fired.add(f.key)
                _inject(group, f, _fault_dict(f))
            elif f.kind in NOTICE_KINDS and f.at_step == step:
                self.fired.add(f.key)
                self._notice(run, f)
                if f.kind is FaultKind.CRASH_IN_NOTICE:  # the host dies inside its window
                    _inject(group, f, {"at_step": f.at_step, "kind": "crash",
                                       "after_s": CRASH_IN_NOTICE_AFTER_S})

    @staticmethod
    def _notice(run: Run, f: Fault) -> None:
        assert run.plan is not None
        host = run.plan.hosts[f.host]
        kind = "host_unhealthy" if f.kind is FaultKind.UNHEALTHY else "preemption_notice"
        # the driver's start in the id: a later driver of the run that meets the fault again
        # (its steps rolled back) sends a new event, not one the dedupe window remembers
        payload = {"schema_version": 1, "kind": kind,
                   "id": f"chaos-{f.at_step}-{f.host}-{kind}-d{int(run.started_at * 1000)}",
                   "target": {"job": run.cfg.run.name, "host": host.instance},
                   "deadline": run.now() + f.deadline_s, "source": "chaos"}
        log.info("chaos_notice", kind=kind, host=host.instance, step=f.at_step)
        run.reactions.submit(payload, source="chaos")


def _inject(group: object, f: Fault, fault: dict) -> None:
    """Arm ``fault`` in its host, where the group can (a notice needs no injection)."""
    if not isinstance(group, InjectsFaults):  # the simulator's config refuses chaos first
        log.error("chaos_unsupported", kind=f.kind.value, group=type(group).__name__)
        return
    log.info("chaos_armed", kind=f.kind.value, host=f.host, step=f.at_step)
    group.inject(f.host, fault)


def _fault_dict(f: Fault) -> dict:
    return {"at_step": f.at_step, "kind": f.kind.value}
