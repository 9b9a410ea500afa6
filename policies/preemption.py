"""What to do when slices go away, when they come back, and when a notice leaves too little time.

Three small policies, each one question:
- ``PlacementPolicy``: after a release, with the healthy slices available now, form the full
  mesh, shrink (fewer slices: the DCN axis shrinks), wait for replacements (bounded), or fail.
- ``GrowPolicy``: while shrunk, capacity returned: grow back, but only from a committed
  checkpoint (re-forming always restores, so growing between checkpoints would lose steps).
- ``DeadlinePolicy``: a notice arrived; is there time to save at the next step boundary?
A slice is ICI-connected: if one of its hosts is doomed, the whole slice is lost to the mesh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

# ---------------------------------------------------------------------------------------------
# Placement: form / shrink / wait / fail


class PlacementKind(StrEnum):
    FORM = "form"
    SHRINK = "shrink"
    WAIT_FOR_REPLACEMENT = "wait_for_replacement"
    FAIL = "fail"


@dataclass(frozen=True, kw_only=True)
class PlacementObservation:
    """Capacity at planning time.

    ``available_slices``: complete, healthy, not cordoned, not doomed slice names (the
    controller's ``planning.complete_slices``). ``target_slices``: slices the run wants (its
    configured DCN size).
    ``waiting_since``: when the run first lacked capacity in this episode (None if it did not).
    """

    now: float
    available_slices: tuple[str, ...]
    target_slices: int
    waiting_since: float | None = None
    warm_slices: tuple[str, ...] = ()
    """Slices with warm processes (the last mesh's, standbys): chosen before cold ones."""


@dataclass(frozen=True, kw_only=True)
class PlacementDecision:
    """``slices`` to form on (FORM/SHRINK); ``until``/``needed`` for WAIT; ``reason`` always."""

    kind: PlacementKind
    reason: str
    slices: tuple[str, ...] = ()
    needed: int = 0
    until: float | None = None


@dataclass(frozen=True, kw_only=True)
class PlacementPolicy:
    """Wait up to ``max_wait_s`` for replacement slices; if elastic, continue on at least
    ``min_slices`` after ``shrink_after_s`` of waiting (0 = shrink at once)."""

    max_wait_s: float
    elastic: bool = False
    min_slices: int = 1
    shrink_after_s: float = 0.0

    def decide(self, observation: PlacementObservation) -> PlacementDecision:
        obs = observation
        have = len(obs.available_slices)
        if have >= obs.target_slices:
            warm = set(obs.warm_slices)
            chosen = tuple(sorted(sorted(obs.available_slices, key=lambda s: (s not in warm, s))
                                  [: obs.target_slices]))
            return PlacementDecision(
                kind=PlacementKind.FORM,
                slices=chosen,
                reason=f"{have} healthy slices for a target of {obs.target_slices}",
            )
        needed = obs.target_slices - have
        since = obs.now if obs.waiting_since is None else obs.waiting_since
        waited = obs.now - since
        if self.elastic and have >= self.min_slices and waited >= self.shrink_after_s:
            return PlacementDecision(
                kind=PlacementKind.SHRINK,
                slices=tuple(sorted(obs.available_slices)),
                needed=needed,
                reason=(
                    f"elastic: continue on {have} of {obs.target_slices} slices "
                    f"(min {self.min_slices}) while {needed} are missing"
                ),
            )
        until = since + self.max_wait_s
        if self.elastic and have >= self.min_slices:
            until = min(until, since + self.shrink_after_s)
        if obs.now < until:
            return PlacementDecision(
                kind=PlacementKind.WAIT_FOR_REPLACEMENT,
                needed=needed,
                until=until,
                reason=f"waiting for {needed} replacement slice(s), {have} available",
            )
        return PlacementDecision(
            kind=PlacementKind.FAIL,
            needed=needed,
            reason=(
                f"no replacement for {needed} slice(s) after {waited:.0f}s "
                f"({have} available, need {obs.target_slices}"
                + (f", elastic min {self.min_slices}" if self.elastic else ", elastic off")
                + "); raise controller.max_wait_for_capacity_s or enable controller.elastic"
            ),
        )


# ---------------------------------------------------------------------------------------------
# Grow back when capacity returns


class GrowKind(StrEnum):
    HOLD = "hold"
    GROW = "grow"
    SAVE_THEN_GROW = "save_then_grow"


@dataclass(frozen=True, kw_only=True)
class GrowObservation:
    """While RUNNING: slices in use, spare complete slices now, step and last committed step."""

    now: float
    current_slices: tuple[str, ...]
    spare_slices: tuple[str, ...]
    target_slices: int
    step: int
    last_committed_step: int | None
    last_resize_at: float | None = None
    save_started_step: int | None = None
    """The step whose (async) save started at this boundary: a grow goes through a blocking
    save that waits for it to commit, so it counts as the checkpoint the grow waits for."""


@dataclass(frozen=True, kw_only=True)
class GrowDecision:
    """GROW: release and re-form on ``slices`` now (the current step is committed).
    SAVE_THEN_GROW: drain and save first, then grow. HOLD: keep running."""

    kind: GrowKind
    reason: str
    slices: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class GrowPolicy:
    """Grow at a checkpoint boundary. With ``wait_for_checkpoint`` the run keeps going until
    the next scheduled save commits; otherwise it asks for a save now. ``min_interval_s``
    between resizes keeps a flapping capacity signal from making the run thrash."""

    enabled: bool = True
    wait_for_checkpoint: bool = True
    min_interval_s: float = 0.0

    def decide(self, observation: GrowObservation) -> GrowDecision:
        obs = observation
        have = len(obs.current_slices)
        if not self.enabled or have >= obs.target_slices or not obs.spare_slices:
            return GrowDecision(kind=GrowKind.HOLD, reason="nothing to grow into")
        if obs.last_resize_at is not None and obs.now - obs.last_resize_at < self.min_interval_s:
            return GrowDecision(
                kind=GrowKind.HOLD,
                reason=f"last resize {obs.now - obs.last_resize_at:.0f}s ago "
                f"(< {self.min_interval_s:g}s)",
            )
        extra = tuple(sorted(obs.spare_slices))[: obs.target_slices - have]
        slices = tuple(sorted(obs.current_slices)) + extra
        why = f"grow {have} -> {len(slices)} slices"
        committed = obs.last_committed_step is not None and obs.last_committed_step >= obs.step
        if committed or obs.save_started_step == obs.step:
            return GrowDecision(
                kind=GrowKind.GROW, slices=slices, reason=f"{why} at step {obs.step}"
            )
        if self.wait_for_checkpoint:
            return GrowDecision(
                kind=GrowKind.HOLD, slices=slices, reason=f"{why} at the next checkpoint"
            )
        return GrowDecision(
            kind=GrowKind.SAVE_THEN_GROW, slices=slices, reason=f"{why} after a save"
        )


# ---------------------------------------------------------------------------------------------
# Deadline: save or fall back


class DrainKind(StrEnum):
    SAVE = "save"
    SAVE_ANYWAY = "save_anyway"
    FALL_BACK_TO_LAST_CHECKPOINT = "fall_back_to_last_checkpoint"
    NOTHING_TO_SAVE = "nothing_to_save"
    RAM_COPY_ONLY = "ram_copy_only"
    """Too little time for a durable save, enough to copy the step to the peers' RAM."""


@dataclass(frozen=True, kw_only=True)
class DrainObservation:
    """A notice's deadline, how long reaching a step boundary and saving take, and progress.

    ``expected_save_s``: observed blocking save time (or an estimate before the first save);
    ``expected_step_s``: time to finish the step in flight (the boundary all hosts stop at).
    """

    now: float
    deadline: float
    expected_save_s: float
    expected_step_s: float
    step: int
    last_committed_step: int | None
    expected_copy_s: float | None = None
    """Seconds to copy the step to the RAM tier's holders; None: the RAM tier is off."""


@dataclass(frozen=True, kw_only=True)
class DrainDecision:
    """``lost_steps``: steps lost if the plan works (0 for SAVE); ``steps_at_risk``: lost if a
    SAVE_ANYWAY does not finish in time; ``restore_step``: where the next incarnation starts."""

    kind: DrainKind
    reason: str
    time_left_s: float
    needed_s: float
    lost_steps: int
    steps_at_risk: int
    restore_step: int | None


@dataclass(frozen=True, kw_only=True)
class DeadlinePolicy:
    """Save when ``time_left >= expected_step + expected_save * save_if_time_left_factor``;
    otherwise ``on_short_deadline`` decides (``save_anyway`` or ``fallback``).
    A deadline already past always falls back: the doomed hosts may be gone mid-save."""

    save_if_time_left_factor: float = 1.5
    on_short_deadline: str = "fallback"

    def __post_init__(self) -> None:
        if self.on_short_deadline not in ("save_anyway", "fallback"):
            raise ValueError("on_short_deadline must be 'save_anyway' or 'fallback'")
        if not math.isfinite(self.save_if_time_left_factor) or self.save_if_time_left_factor <= 0:
            raise ValueError("save_if_time_left_factor must be a positive number")

    def decide(self, observation: DrainObservation) -> DrainDecision:
        obs = observation
        time_left = obs.deadline - obs.now
        needed = obs.expected_step_s + obs.expected_save_s * self.save_if_time_left_factor
        committed = obs.last_committed_step
        uncommitted = obs.step - (committed if committed is not None else 0)
        if committed is not None and committed >= obs.step:
            return DrainDecision(
                kind=DrainKind.NOTHING_TO_SAVE, reason=f"step {obs.step} is already committed",
                time_left_s=time_left, needed_s=0.0, lost_steps=0, steps_at_risk=0,
                restore_step=committed,
            )
        if time_left >= needed and time_left > 0:
            return DrainDecision(
                kind=DrainKind.SAVE,
                reason=f"{time_left:.1f}s left >= {needed:.1f}s needed to stop and save",
                time_left_s=time_left, needed_s=needed, lost_steps=0, steps_at_risk=0,
                restore_step=obs.step,
            )
        short = f"{time_left:.1f}s left < {needed:.1f}s needed"
        if obs.expected_copy_s is not None and time_left > 0:
            copy_needed = obs.expected_step_s + obs.expected_copy_s * self.save_if_time_left_factor
            if time_left >= copy_needed:
                return DrainDecision(
                    kind=DrainKind.RAM_COPY_ONLY,
                    reason=f"{short} for a durable save; copying step {obs.step} to the peer "
                           f"hosts' RAM only ({copy_needed:.2f}s): no durable copy of it",
                    time_left_s=time_left, needed_s=copy_needed, lost_steps=0,
                    steps_at_risk=uncommitted, restore_step=obs.step)
        if self.on_short_deadline == "save_anyway" and time_left > 0:
            return DrainDecision(
                kind=DrainKind.SAVE_ANYWAY,
                reason=f"{short}; saving anyway (controller.deadline.on_short_deadline)",
                time_left_s=time_left, needed_s=needed, lost_steps=0,
                steps_at_risk=uncommitted, restore_step=obs.step,
            )
        why = "deadline passed" if time_left <= 0 else short
        return DrainDecision(
            kind=DrainKind.FALL_BACK_TO_LAST_CHECKPOINT,
            reason=f"{why}; falling back to step {committed}, losing {uncommitted} step(s)",
            time_left_s=time_left, needed_s=needed, lost_steps=uncommitted,
            steps_at_risk=uncommitted, restore_step=committed,
        )
