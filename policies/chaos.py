"""Deterministic fault injection keyed by (host, step), so fault tests and demos repeat exactly.

A fault fires once: after a fall-back restore the run passes the same step again, and firing a
kill there again would loop forever. The schedule is immutable; the caller keeps the set of fired
keys and passes it in. ``due`` also returns faults whose step was skipped (the driver may see
steps in batches), never ones already fired.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    PREEMPT = "preempt"  # an announced notice for the host with ``deadline_s``
    KILL = "kill"  # kill -9 of the host actor (after earlier async saves commit): unannounced loss
    HANG = "hang"  # the host stops answering: a barrier must time out
    UNHEALTHY = "unhealthy"  # a health report that marks the host unhealthy
    KILL_IN_SAVE = "kill_in_save"  # kill -9 right after step ``at_step``'s async save started
    HANG_INIT = "hang_init"  # the host never joins the distributed init of the group formed
    # at the first re-form whose starting step is >= ``at_step`` (0 = the first group)
    CRASH_IN_NOTICE = "crash_in_notice"  # a preemption notice for the host with ``deadline_s``,
    # then its process dies by SIGSEGV ``CRASH_IN_NOTICE_AFTER_S`` later: a spot host that
    # crashes inside its notice window (the death is the preemption, not a host failure)


CRASH_IN_NOTICE_AFTER_S = 1.0
"""Seconds from a ``crash_in_notice`` fault's notice to its host's SIGSEGV."""

NOTICE_KINDS = frozenset({FaultKind.PREEMPT, FaultKind.UNHEALTHY, FaultKind.CRASH_IN_NOTICE})
"""Kinds that deliver a notice through the driver at exactly ``at_step``."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    """Inject ``kind`` on mesh host index ``host`` when the run reaches ``at_step``."""

    at_step: int
    host: int
    kind: FaultKind
    deadline_s: float = 30.0

    def __post_init__(self) -> None:
        if self.at_step < 0 or self.host < 0:
            raise ValueError("at_step and host must be >= 0")
        if self.deadline_s < 0:
            raise ValueError("deadline_s must be >= 0")

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.at_step, self.host, self.kind.value)


@dataclass(frozen=True, kw_only=True)
class FaultSchedule:
    faults: tuple[Fault, ...] = ()

    def due(self, step: int, *, fired: Collection[tuple[int, int, str]] = ()) -> list[Fault]:
        """Faults with ``at_step <= step`` not in ``fired`` (by ``Fault.key``), in step order."""
        return sorted(
            (f for f in self.faults if f.at_step <= step and f.key not in fired),
            key=lambda f: f.key,
        )

    @property
    def last_step(self) -> int | None:
        return max((f.at_step for f in self.faults), default=None)
