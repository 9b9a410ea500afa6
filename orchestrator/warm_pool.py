"""Host processes kept warm between groups, by Ray node: why a re-form need not start cold.

Two kinds: *survivors* of a drained group (``park``: every process leaves the JAX runtime
together, in process, and waits), and *standbys* on spare hosts (started with nothing to do,
JAX imported). The next group ``take``s the process on each of its nodes and ``rejoin``s it;
whatever it does not take is killed (a parked process on a host the new mesh left out), except
standbys, which wait for a later re-form. Everything here is an optimisation: a process that
cannot be released or rejoined is killed and its group starts a fresh one on that node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import structlog

from orchestrator.hosts import HostRef

log = structlog.get_logger(__name__)


@dataclass
class PoolStats:
    parked: int = 0
    release_failed: int = 0
    standbys_started: int = 0
    taken_parked: int = 0
    taken_standby: int = 0
    release_s: list[float] = field(default_factory=list)


class WarmPool:
    """``start_standby(host)`` starts a process on ``host``'s node with nothing to do (the
    group's actor class with ``spec=None``) and returns its handle."""

    def __init__(self, *, start_standby: Callable[[HostRef], Any],
                 release_timeout_s: float = 20.0) -> None:
        self.start_standby = start_standby
        self.release_timeout_s = release_timeout_s
        self.parked: dict[str, Any] = {}
        self.standby: dict[str, Any] = {}
        self.stats = PoolStats()

    def park(self, actors: Sequence[tuple[str, Any]], *, timeout_s: float | None = None) -> int:
        """Release every (node id, actor) of one group together (the runtime's shutdown is a
        barrier) and keep those that answered within ``timeout_s`` (default: the pool's);
        kill the rest. Returns how many were kept."""
        bound = self.release_timeout_s if timeout_s is None else timeout_s
        refs = [a.release.remote() for _, a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=bound) if refs else ([], [])
        kept = 0
        for (node_id, actor), ref in zip(actors, refs, strict=True):
            try:
                if ref not in ready:
                    raise TimeoutError(f"release took over {bound:g} s")
                out = ray.get(ref)
            except Exception as exc:
                self.stats.release_failed += 1
                log.warning("release_failed", node=node_id[:12], error=str(exc)[:300])
                _kill(actor)
                continue
            self.stats.release_s.append(round(float(out["release_s"]), 3))
            _kill(self.parked.pop(node_id, None))
            self.parked[node_id] = actor
            kept += 1
        self.stats.parked += kept
        return kept

    def take(self, node_id: str) -> tuple[Any, str] | None:
        """The warm process on ``node_id`` and its kind ("parked" or "standby"), or None."""
        if (actor := self.parked.pop(node_id, None)) is not None:
            self.stats.taken_parked += 1
            return actor, "parked"
        if (actor := self.standby.pop(node_id, None)) is not None:
            self.stats.taken_standby += 1
            return actor, "standby"
        return None

    def drop_parked(self) -> None:
        """Kill the parked processes no group took (their hosts left the mesh)."""
        for actor in self.parked.values():
            _kill(actor)
        self.parked = {}

    def ensure_standby(self, hosts: Sequence[HostRef]) -> int:
        """Keep one warm standby on each of ``hosts`` (spare hosts not in the mesh); standbys
        on other hosts are killed. Returns how many were started now."""
        wanted = {h.node_id: h for h in hosts}
        for node_id in [n for n in self.standby if n not in wanted]:
            _kill(self.standby.pop(node_id))
        started = 0
        for node_id, h in wanted.items():
            if node_id in self.standby:
                continue
            try:
                actor = self.start_standby(h)
                actor.warm.remote()  # not awaited: a rejoin queued behind it just waits
            except Exception as exc:  # a standby is an optimisation
                log.warning("standby_start_failed", node=node_id[:12], error=str(exc)[:300])
                continue
            self.standby[node_id] = actor
            started += 1
        self.stats.standbys_started += started
        return started

    def close(self) -> None:
        """Kill every process kept here (the run is over)."""
        self.drop_parked()
        for actor in self.standby.values():
            _kill(actor)
        self.standby = {}


def _kill(actor: Any) -> None:
    if actor is None:
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception as exc:  # already dead
        log.debug("kill_failed", error=str(exc))
