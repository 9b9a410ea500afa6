"""Our badput causes in the buckets of Google's ``ml-goodput-measurement`` (its ``BadputType``),
so people and dashboards that speak that vocabulary read our runs without a translation table.

Bucket names are the library's ``BadputType`` names in lower case. Each cause lands in one
bucket (pure; the seconds still sum to our badput):

- ``startup`` (PLANNING/FORMING before the first step: processes, ``jax.distributed``)
  → ``tpu_initialization``;
- ``restore`` before the first step (a fresh init, or the checkpoint a new job starts from)
  → ``training_prep``; ``restore`` after it (a restart)
  → ``unproductive_checkpoint_restore_time``;
- ``compile`` → ``program_startup`` (the library counts the first step's extra time: compiling);
- ``checkpoint`` (CHECKPOINTING and the blocking part of saves)
  → ``unproductive_checkpoint_save_time``;
- ``lost_steps`` (steps re-done after a rollback) → ``wasted_progress_from_disruption``;
- ``reform``, ``drain``, ``release``, ``waiting_for_capacity``, ``backoff``
  → ``infrastructure_recovery_from_disruption``;
- ``idle`` → ``other``.

The library's ``data_loading_sync`` has no value here: the input pipeline runs inside the step
and is not timed apart, so the bucket is absent (not zero) wherever we publish the buckets.
Time-to-recover per event stays ours: the library has no such figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

BUCKETS: tuple[str, ...] = (
    "tpu_initialization", "training_prep", "program_startup", "unproductive_checkpoint_save_time",
    "unproductive_checkpoint_restore_time", "wasted_progress_from_disruption",
    "infrastructure_recovery_from_disruption", "other")
NOT_MEASURED: tuple[str, ...] = ("data_loading_sync",)
"""Buckets of the library we do not measure apart (see the module docstring)."""

_RECOVERY = "infrastructure_recovery_from_disruption"
_BUCKET_OF: dict[str, str] = {
    "startup": "tpu_initialization", "compile": "program_startup",
    "checkpoint": "unproductive_checkpoint_save_time",
    "lost_steps": "wasted_progress_from_disruption",
    "reform": _RECOVERY, "drain": _RECOVERY, "release": _RECOVERY,
    "waiting_for_capacity": _RECOVERY, "backoff": _RECOVERY, "idle": "other",
}


class IntervalLike(Protocol):
    @property
    def state(self) -> str: ...
    @property
    def badput_s(self) -> Mapping[str, float]: ...


def bucket_of(cause: str, *, before_first_step: bool) -> str:
    """The library's bucket for one of our causes (an unknown cause is ``other``)."""
    if cause == "restore":
        return "training_prep" if before_first_step else "unproductive_checkpoint_restore_time"
    return _BUCKET_OF.get(cause, "other")


def ml_badput(intervals: Iterable[IntervalLike]) -> dict[str, float]:
    """Seconds per bucket over the run's state intervals, in time order."""
    out = dict.fromkeys(BUCKETS, 0.0)
    seen_running = False
    for iv in intervals:
        seen_running = seen_running or iv.state == "RUNNING"
        for cause, seconds in iv.badput_s.items():
            if seconds:
                out[bucket_of(cause, before_first_step=not seen_running)] += seconds
    return out
