"""The emulated cloud's capacity: a preempted slice goes away at its notice's deadline and a new
slice (new name, new Ray node ids) joins ``replace_after_s`` later.

Real spot / queued TPU capacity behaves so: the notice gives ~30 s, the VMs stop at its end, and
the replacement a queued resource gets is a new slice some time later. Without this the emulated
cluster kept a preempted slice's nodes alive (only the driver's exclusion kept them out), and
benchmarks modelled capacity differently per system. ``cluster.emulate.replace_after_s`` turns it
on, for local runs, tests and ``bench/`` alike.

``CapacitySchedule`` is the pure part (what happens when); ``EmulatedCloud`` applies it to an
``EmulatedCluster`` from one daemon thread. Neither ever raises into the training run: a failed
removal or start is logged and the run sees what Ray sees.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import structlog

log = structlog.get_logger(__name__)

#: Notices that end with the VM gone (a maintenance window or a health report does not).
RECLAIMING_KINDS = frozenset({"preemption_notice"})


@dataclass(frozen=True)
class CapacityAction:
    """``reclaim``: the slice's hosts vanish; ``replace``: a new slice of the same shape joins."""

    kind: Literal["reclaim", "replace"]
    at: float
    slice_name: str


@dataclass
class CapacitySchedule:
    """When preempted slices go and when their replacements come (pure; times in seconds)."""

    replace_after_s: float
    _actions: list[CapacityAction] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)

    def preempted(self, slices: Iterable[str], *, deadline: float | None, now: float
                  ) -> list[CapacityAction]:
        """Schedule each newly preempted slice: gone at the deadline (now if it has none or it
        passed), replaced ``replace_after_s`` after that. A slice is reclaimed once."""
        at = max(now, deadline if deadline is not None else now)
        new = []
        for name in sorted(set(slices) - self._seen):
            self._seen.add(name)
            new += [CapacityAction("reclaim", at, name),
                    CapacityAction("replace", at + self.replace_after_s, name)]
        self._actions = sorted([*self._actions, *new], key=lambda a: (a.at, a.kind != "reclaim"))
        return new

    def due(self, now: float) -> list[CapacityAction]:
        """Pop the actions whose time has come, in order."""
        ready = [a for a in self._actions if a.at <= now]
        self._actions = [a for a in self._actions if a.at > now]
        return ready

    def next_at(self) -> float | None:
        return self._actions[0].at if self._actions else None


class Capacity(Protocol):
    """What the cloud acts on (``orchestrator.raygroup.topology.EmulatedCluster``)."""

    def slice_workers(self, slice_name: str) -> list[int]: ...
    def remove_host(self, slice_name: str, worker_id: int) -> None: ...
    def add_slice(self, hosts: int, *, name: str | None = None) -> str: ...


def slices_named(event: Any, hosts: Sequence[Any], *, cluster: str | None = None) -> list[str]:
    """The slices a reclaiming notice takes away: every slice with a host it names (a TPU slice
    is preempted as a unit). Other events name none."""
    from orchestrator.events.targeting import resolve_targets

    if getattr(event.kind, "value", event.kind) not in RECLAIMING_KINDS:
        return []
    targeting = resolve_targets(event, hosts, cluster=cluster)
    if targeting.job_wide:
        return sorted({h.slice_name for h in hosts})
    return sorted({h.slice_name for h in hosts if h.node_id in targeting.node_ids})


class EmulatedCloud:
    """Applies a ``CapacitySchedule`` to the emulated cluster from a daemon thread."""

    def __init__(self, capacity: Capacity, *, replace_after_s: float, hosts_per_slice: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity
        self.schedule = CapacitySchedule(replace_after_s)
        self.hosts_per_slice = hosts_per_slice
        self._clock = clock
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.history: list[dict] = []

    def on_event(self, event: Any, hosts: Sequence[Any]) -> None:
        """An accepted event (the intake's observer): schedule the slices it reclaims."""
        names = slices_named(event, hosts)
        if not names:
            return
        with self._cond:
            new = self.schedule.preempted(names, deadline=event.deadline, now=self._clock())
            self._cond.notify()
        for a in new:
            log.info("emulated_capacity_scheduled", action=a.kind, slice=a.slice_name,
                     in_s=round(a.at - self._clock(), 2))

    def step(self) -> list[CapacityAction]:
        """Apply what is due by the clock (the thread calls this; tests, with a fake clock)."""
        with self._cond:
            due = self.schedule.due(self._clock())
        for action in due:
            self._apply(action)
        return due

    def _apply(self, action: CapacityAction) -> None:
        try:
            if action.kind == "reclaim":
                for w in self.capacity.slice_workers(action.slice_name):
                    self.capacity.remove_host(action.slice_name, w)
                detail: dict = {"slice": action.slice_name}
            else:
                detail = {"replaces": action.slice_name,
                          "slice": self.capacity.add_slice(self.hosts_per_slice)}
        except Exception as exc:  # the emulator must never take the run down
            log.warning("emulated_capacity_failed", action=action.kind, slice=action.slice_name,
                        error=f"{type(exc).__name__}: {exc}")
            return
        self.history.append({"action": action.kind, "at": self._clock(), **detail})
        log.info(f"emulated_slice_{'reclaimed' if action.kind == 'reclaim' else 'returned'}",
                 **detail)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="emulated-cloud", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                nxt = self.schedule.next_at()
                wait = None if nxt is None else max(0.0, nxt - self._clock())
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
            self.step()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
