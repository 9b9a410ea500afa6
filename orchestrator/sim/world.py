"""Virtual time, the world's scheduled happenings, and the probe that times the controller.

Nothing in the simulator waits: time moves only when the controller sleeps on the ``SimClock``
or waits on the simulated group, and moving it runs every world action due on the way (a host
dies, a notice is published, capacity comes back), in time order, deterministically (ties break
by insertion order). Reaching the horizon raises ``HorizonReached``, a ``BaseException`` the
controller's own ``except Exception`` handlers let through, so the run is cut there as an
observation window, not failed.

The ``Probe`` measures the controller's own wall time: every seam call (group calls, sleeps)
marks a boundary, and the real time between leaving one boundary and entering the next is one
controller *decision* (what the real driver would spend deciding, with the world's cost taken
out). A decision right after the world delivered something (a notice, a lost host, capacity
back) is tagged with that event's kind, and every decision with the pair of seam calls around
it (``poll->start_chunk``: absorbing a chunk and starting the next), so each controller step's
cost can be followed across mesh sizes.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

START_AT = 1_800_000_000.0  # a fixed, plausible unix time (2027-01-15): runs are reproducible


class HorizonReached(BaseException):
    """The simulated window ended; raised out of a seam call at the horizon."""


@dataclass
class Probe:
    """Controller decision times (wall seconds), all and per delivered event kind."""

    enabled: bool = True
    decisions: list[float] = field(default_factory=list)
    by_event: dict[str, list[float]] = field(default_factory=dict)
    by_step: dict[str, list[float]] = field(default_factory=dict)
    seam_s: float = 0.0
    _left_at: float | None = None
    _entered_at: float = 0.0
    _tag: str | None = None
    _last: str = "start"

    def enter(self, name: str) -> None:
        """A seam call ``name`` starts: the gap since the last one was the controller's."""
        now = time.perf_counter()
        self._entered_at = now
        if self.enabled and self._left_at is not None:
            gap = now - self._left_at
            self.decisions.append(gap)
            self.by_step.setdefault(f"{self._last}->{name}", []).append(gap)
            if self._tag is not None:
                self.by_event.setdefault(self._tag, []).append(gap)
                self._tag = None
        self._left_at = None
        self._last = name

    def leave(self) -> None:
        now = time.perf_counter()
        self.seam_s += now - self._entered_at
        self._left_at = now

    def delivered(self, kind: str) -> None:
        """The world just handed the controller something to decide about."""
        self._tag = kind


class World:
    """The event queue on virtual time."""

    def __init__(self, *, start: float = START_AT, horizon_s: float) -> None:
        self.t = start
        self.start = start
        self.end = start + horizon_s
        self._heap: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = 0
        self.log: list[tuple[float, str]] = []  # (virtual time, what happened)

    def at(self, t: float, label: str, action: Callable[[], None]) -> None:
        """Run ``action`` when virtual time reaches ``t`` (never earlier than now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.t), self._seq, label, action))

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def advance_to(self, t: float) -> None:
        """Move time to ``t``, running each due action at its own time; stop at the horizon."""
        while self._heap and self._heap[0][0] <= t:
            when, _, label, action = heapq.heappop(self._heap)
            if when >= self.end:
                heapq.heappush(self._heap, (when, 0, label, action))
                break
            self.t = max(self.t, when)
            self.log.append((self.t, label))
            action()
        if t >= self.end:
            self.t = self.end
            raise HorizonReached()
        self.t = max(self.t, t)


class SimClock:
    """The controller's ``Clock`` on world time: ``sleep`` runs the world forward."""

    def __init__(self, world: World, probe: Probe) -> None:
        self.world, self.probe = world, probe

    def now(self) -> float:
        return self.world.t

    def sleep(self, seconds: float) -> None:
        self.probe.enter("sleep")
        try:
            self.world.advance_to(self.world.t + max(0.0, seconds))
        finally:
            self.probe.leave()
