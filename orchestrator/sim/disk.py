"""Checkpoints that outlive a group: committed steps and saves still in flight.

A save counts only once committed (as the controller's contract with Orbax says); a save whose
hosts die before it commits never does. Only the newest few committed steps are kept, as Orbax
keeps a few, which also bounds the work per chunk over a simulated week.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

EPS = 1e-9
KEEP_COMMITTED = 16


@dataclass
class Save:
    step: int
    commit_at: float
    nodes: frozenset[str]


@dataclass
class Disk:
    """Checkpoints that outlive groups: committed (step, at) and in-flight saves."""

    committed: list[tuple[int, float]] = field(default_factory=list)
    pending: list[Save] = field(default_factory=list)

    def settle(self, now: float) -> None:
        done = [s for s in self.pending if s.commit_at <= now + EPS]
        if done:
            self.pending = [s for s in self.pending if s.commit_at > now + EPS]
            for s in done:
                self.commit(s.step, s.commit_at)

    def commit(self, step: int, at: float) -> None:
        """Record a committed step; only the newest ``KEEP_COMMITTED`` are kept (as Orbax
        keeps a few), which bounds the work per chunk over a simulated week."""
        if any(s == step for s, _ in self.committed):
            return
        self.committed.append((step, at))
        self.committed.sort()
        del self.committed[:-KEEP_COMMITTED]

    def newest(self, now: float, skip: Collection[int] = ()) -> int | None:
        self.settle(now)
        return next((s for s, _ in reversed(self.committed) if s not in skip), None)

    def lost(self, nodes: frozenset[str], at: float) -> None:
        """Hosts died at ``at``: saves they were part of and had not committed never will."""
        self.settle(at)
        self.pending = [s for s in self.pending if not (s.nodes & nodes)]
