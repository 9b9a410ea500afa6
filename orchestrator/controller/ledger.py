"""The run's data: steps, checkpoints, losses, restarts and recoveries, in one place.

Handlers read and update this ledger instead of attributes scattered over a class; the summary
is derived from it. ``last_committed`` only ever moves to a step the hosts reported *committed*
(the checkpoint library finished writing it), never to one whose save only started.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from policies.causes import StopCause
from policies.restart_budget import RestartRecord

_KEEP_STEP_TIMES = 200
PACK_WARMUP = 4
"""A group's first periodic copies measure its start, not its copies: the first lays the copy
out and touches a new buffer, the next ones compete with the compile, the standbys' pre-form
and the first steps' allocations (a 256 MiB state here: 2.7, 0.77, 0.24, 0.22 s, then
0.03-0.05 s). They are left out of the interval's measure."""


class RecoveryKind(StrEnum):
    """What a recovery recovered from: every re-form the run went through is one, so the
    summary's ``recoveries`` accounts for all of them (not only notices and failures)."""

    ANNOUNCED = "announced"  # a notice: drained, saved, re-formed
    UNANNOUNCED = "unannounced"  # a failure
    GROW = "grow"  # capacity came back: a planned re-form on more slices, no deadline
    DRIVER_RESTART = "driver_restart"  # a new driver resumed a run dir an earlier one left


GROW_CAUSE = "capacity_returned"
METRICS_GAP_WHY = (
    "the hosts trained and checkpointed these steps after the driver that received their step "
    "records had died; the records lived only in that driver's memory, so their loss and step "
    "times cannot be recovered (the training itself is in the checkpoint)")


@dataclass
class Recovery:
    """One recovery, from the notice (announced), the failure (unannounced), the grow's drain
    or the resumed driver's start (driver_restart) to the first productive step after it.
    Serialised into the summary's ``recoveries``."""

    kind: RecoveryKind
    cause: str
    started_at: float
    step: int
    event_id: str | None = None
    error: str | None = None
    boundary_at: float | None = None
    saved_step: int | None = None
    save_s: float | None = None
    restored_step: int | None = None
    lost_steps: int = 0
    skipped_checkpoints: list[dict] = field(default_factory=list)
    further_failures: list[dict] = field(default_factory=list)
    first_step_at: float | None = None
    to_first_step_s: float | None = None
    phases_s: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    """How the group after it got its processes: fresh, parked (kept warm), standby."""
    handover: str | None = None
    """Announced: how HANDING_OVER ended ("ready", or why not); None without one."""
    handover_s: float | None = None
    """Seconds the old group trained on while the replacement warmed (productive)."""
    reason: str | None = None
    """A grow: what it grew (``grow 1 -> 2 slices at step 40``)."""
    previous_driver: dict | None = None
    """A driver restart: the last timeline line the earlier driver wrote (state, step, at) and
    whether it ``ended`` (a terminal state) or died in that state."""
    metrics_gap: dict | None = None
    """Steps restored past with no step record (``{"steps": [first, last], "why": ...}``)."""

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v not in (None, [], {})}
        return {**out, "kind": RecoveryKind(self.kind).value}  # plain text in summary.json


def eval_summary(step: int, ev: dict) -> dict:
    """What ``summary.json`` keeps of an eval (``last_eval``). ``unit``: what ``tokens``
    counts, ``examples`` when it counts the rows (a task without ``tokens_per_example``: a
    classifier, whose perplexity means nothing and is not printed)."""
    loss = float(ev["loss"])
    try:
        perplexity = math.exp(loss)
    except OverflowError:
        perplexity = math.inf
    tokens = int(ev.get("tokens", 0))
    rows = ev.get("rows")
    return {"step": step, "loss": loss, "perplexity": perplexity, "tokens": tokens,
            "batches": int(ev.get("batches", 0)),
            "seconds": round(float(ev.get("seconds", 0.0)), 4),
            "metrics": dict(ev.get("metrics") or {}),
            "unit": "examples" if rows is not None and int(rows) == tokens else "tokens"}


@dataclass
class RecoveryLedger:
    step: int = 0
    max_step_reached: int = 0
    last_committed: int | None = None
    save_started: int | None = None  # newest step whose async save started (not yet committed)
    lost_steps: int = 0
    first_loss: float | None = None
    last_loss: float | None = None
    step_times: list[float] = field(default_factory=list)
    save_costs: list[float] = field(default_factory=list)
    copy_costs: list[float] = field(default_factory=list)
    """Seconds steps waited for their RAM-tier copy (a durable save written from RAM costs the
    step only this, so it is not a save cost)."""
    pack_costs: list[float] = field(default_factory=list)
    """Of those, the periodic copies' packs alone (less the wait for the previous copy's
    delivery; a drain's copy waits for delivery too): what ``checkpoint.ram.every: auto``
    weighs against the step time."""
    deliver_costs: list[float] = field(default_factory=list)
    """Seconds a periodic copy took from its pack to its delivery, where a step measured it
    (the next copy waited for it: the wait plus the steps between them)."""
    packed_in: int | None = None
    """The incarnation whose periodic copies are being counted."""
    packs_seen: int = 0
    """Periodic copies of ``packed_in`` seen so far: its first ``PACK_WARMUP`` are left out of
    ``pack_costs``."""
    copy_every: int | None = None
    """The RAM tier's copy interval in force under ``every: auto`` (None: not chosen)."""
    copy_intervals: list[dict] = field(default_factory=list)
    """Each choice of that interval: step, every, reason and its inputs (summary.json)."""
    compile_times: list[float] = field(default_factory=list)
    compiles: list[dict] = field(default_factory=list)
    """Per COMPILING phase: {incarnation, compile_s, source (loaded|compiled|mixed), key}."""
    forms: list[dict] = field(default_factory=list)
    """Per FORMING phase: {incarnation, processes: {fresh, parked, standby}}."""
    restarts: list[RestartRecord] = field(default_factory=list)
    restores: list[dict] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    open_recovery: Recovery | None = None
    incarnation: int = 0
    line_base: int = 0
    """The step the current line of training started from (the last restore's)."""
    line_reached: int = 0
    """The furthest step reached since that restore (what a stop now would discard)."""
    ram_step: int | None = None  # the newest step a drain copied to the RAM tier
    recorded_upto: int | None = None
    """The newest step whose record reached the driver (None: not read from metrics.jsonl)."""
    metrics_gaps: list[list[int]] = field(default_factory=list)
    """[first, last] step ranges restored past without a step record (never in metrics.jsonl)."""
    last_eval: dict | None = None
    """The newest eval host 0 reported (``eval.every``): step, loss, perplexity, tokens,
    seconds, the task's other eval metrics."""

    # ---- progress --------------------------------------------------------------------------

    def reached(self, step: int) -> None:
        """A host reported this step (the group got at least this far)."""
        self.max_step_reached = max(self.max_step_reached, step)
        self.line_reached = max(self.line_reached, step)

    def ram_copied(self, step: int) -> None:
        """A drain copied ``step`` to the RAM tier (a restore may read it)."""
        self.ram_step = step if self.ram_step is None else max(self.ram_step, step)

    def unsaved_steps(self) -> int:
        """Steps reached since the last restore that no save holds (not the durable commit, not
        a drain's RAM copy): what ending the run now discards."""
        base = max(self.line_base, self.last_committed or 0, self.ram_step or 0)
        return max(0, self.line_reached - base)

    def committed(self, step: int | None) -> None:
        """The hosts report ``step`` committed; never moves backwards."""
        if step is not None and (self.last_committed is None or step > self.last_committed):
            self.last_committed = step

    def absorb(self, step: int, committed_step: int | None, records: tuple[dict, ...]) -> None:
        self.step = step
        self.reached(step)
        self.committed(committed_step)
        for rec in records:
            self.recorded_upto = max(self.recorded_upto or 0, int(rec["step"]))
            self.step_times.append(float(rec["step_time_s"]))
            if self.first_loss is None:
                self.first_loss = rec["loss"]
            self.last_loss = rec["loss"]
            if rec.get("saved"):
                self.save_started = int(rec["step"])
            if rec.get("eval"):
                self.last_eval = eval_summary(int(rec["step"]), rec["eval"])
            if rec.get("ram_copy_s"):
                self.copy_costs.append(float(rec["ram_copy_s"]))
                if not rec.get("saved_from_ram"):
                    if self.packed_in != self.incarnation:
                        self.packed_in, self.packs_seen = self.incarnation, 0
                    self.packs_seen += 1
                    if self.packs_seen > PACK_WARMUP:
                        wait = float(rec.get("ram_wait_s") or 0.0)
                        self.pack_costs.append(max(0.0, float(rec["ram_copy_s"]) - wait))
                        if wait > 0.001 and rec.get("step_time_s"):
                            self.deliver_costs.append(
                                wait + (self.copy_every or 1) * float(rec["step_time_s"]))
            if rec.get("checkpoint_blocking_s") and not rec.get("saved_from_ram"):
                self.save_costs.append(float(rec["checkpoint_blocking_s"]))
        del self.copy_costs[:-_KEEP_STEP_TIMES]
        del self.pack_costs[:-_KEEP_STEP_TIMES]
        del self.deliver_costs[:-_KEEP_STEP_TIMES]
        del self.step_times[:-_KEEP_STEP_TIMES]

    def median_step_s(self, last: int = 20) -> float | None:
        recent = self.step_times[-last:]
        return statistics.median(recent) if recent else None

    def median_copy_s(self, last: int = 20) -> float | None:
        recent = self.copy_costs[-last:]
        return statistics.median(recent) if recent else None

    def median_pack_s(self, last: int = 20) -> float | None:
        recent = self.pack_costs[-last:]
        return statistics.median(recent) if recent else None

    def median_deliver_s(self, last: int = 20) -> float | None:
        recent = self.deliver_costs[-last:]
        return statistics.median(recent) if recent else None

    def median_save_s(self, last: int = 5) -> float | None:
        recent = self.save_costs[-last:]
        return statistics.median(recent) if recent else None

    # ---- restores and recoveries -----------------------------------------------------------

    def restored(self, *, restored_step: int | None, step: int, restore_s: float,
                 skipped: tuple[dict, ...] = (), tier: str = "durable",
                 tier_reason: str = "", nbytes: int = 0, data: dict | None = None) -> int:
        """Record a restore; returns the steps lost (re-done) because of it: from the furthest
        step reached, or from a newer checkpoint passed over as unreadable (which a resumed
        driver only learns from the skip). A restore from the RAM tier leaves
        ``last_committed`` (the durable tier's) where it was. ``data``: where the data resumed
        (``Restored.data``), kept with the restore."""
        newest_skipped = max((int(s["step"]) for s in skipped), default=0)
        self.reached(newest_skipped)
        lost = max(0, self.max_step_reached - step)
        self.lost_steps += lost
        self.step = step
        self.line_base = self.line_reached = step
        gap = self._metrics_gap(restored_step)
        self.recorded_upto = max(self.recorded_upto or 0, step)  # known from here on
        if tier != "ram":
            self.last_committed = restored_step
        self.restores.append({"incarnation": self.incarnation, "restored_step": restored_step,
                              "step": step, "lost_steps": lost, "restore_s": round(restore_s, 3),
                              "skipped": list(skipped), "tier": tier,
                              "tier_reason": tier_reason, "nbytes": nbytes,
                              **({"data": data} if data is not None else {})})
        r = self.open_recovery
        if r is not None:
            r.lost_steps += lost
            r.restored_step = restored_step
            r.skipped_checkpoints.extend(skipped)
            if gap is not None:
                r.metrics_gap = {"steps": gap, "why": METRICS_GAP_WHY}
        return lost

    def _metrics_gap(self, restored_step: int | None) -> list[int] | None:
        """The steps a restore passes over whose records never reached metrics.jsonl (a
        driver that died while the hosts trained on), recorded in ``metrics_gaps``."""
        if (restored_step is None or self.recorded_upto is None
                or restored_step <= self.recorded_upto):
            return None
        gap = [self.recorded_upto + 1, restored_step]
        self.metrics_gaps.append(gap)
        return gap

    def open_announced(self, *, cause: StopCause, event_id: str, noticed_at: float,
                       now: float) -> Recovery:
        self.open_recovery = Recovery(kind=RecoveryKind.ANNOUNCED, cause=cause.value,
                                      started_at=noticed_at, step=self.step, event_id=event_id,
                                      boundary_at=now)
        return self.open_recovery

    def open_grow(self, *, reason: str, event_id: str, now: float) -> Recovery:
        """A grow back: from its drain to the first step on the larger mesh, so its cost
        (save, re-form, restore, compile) is in ``recoveries`` like any other re-form's."""
        self.open_recovery = Recovery(kind=RecoveryKind.GROW, cause=GROW_CAUSE, started_at=now,
                                      step=self.step, event_id=event_id, boundary_at=now,
                                      reason=reason)
        return self.open_recovery

    def open_resumed(self, *, cause: str, started_at: float, recorded_upto: int | None,
                     previous: dict | None) -> Recovery:
        """This driver resumes a run an earlier driver left (killed, stopped, resubmitted):
        a recovery from this driver's start to its first step. The steps the earlier driver
        recorded count as reached, so the restore's rollback past them counts as lost; a
        failure already open (before the first restore) joins it as a further failure."""
        if recorded_upto:
            self.reached(recorded_upto)
        r = Recovery(kind=RecoveryKind.DRIVER_RESTART, cause=cause, started_at=started_at,
                     step=max(self.step, recorded_upto or 0), previous_driver=previous)
        if self.open_recovery is not None:
            old = self.open_recovery
            r.further_failures = [{"cause": old.cause, "error": old.error, "at": old.started_at},
                                  *old.further_failures]
        self.open_recovery = r
        return r

    def open_unannounced(self, *, cause: StopCause, error: str, now: float) -> Recovery:
        """A failure; a second one before the first productive step joins the open recovery."""
        if self.open_recovery is not None:
            self.open_recovery.further_failures.append(
                {"cause": cause.value, "error": error[:500], "at": now})
            return self.open_recovery
        self.open_recovery = Recovery(kind=RecoveryKind.UNANNOUNCED, cause=cause.value,
                                      started_at=now, step=self.step, error=error[:500])
        return self.open_recovery

    def formed(self, processes: dict[str, int]) -> None:
        self.forms.append({"incarnation": self.incarnation, "processes": dict(processes)})
        if self.open_recovery is not None:
            self.open_recovery.processes = dict(processes)

    def close_recovery(self, *, now: float, phases_s: dict[str, float]) -> Recovery | None:
        r = self.open_recovery
        if r is None:
            return None
        r.first_step_at = now
        r.to_first_step_s = round(now - r.started_at, 3)
        r.phases_s = phases_s
        self.recoveries.append(r)
        self.open_recovery = None
        return r

    def restart_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.restarts:
            out[r.cause.value] = out.get(r.cause.value, 0) + 1
        return out
