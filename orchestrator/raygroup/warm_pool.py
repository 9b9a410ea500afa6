"""Host processes kept warm between groups, by Ray node: why a re-form need not start cold.

Two kinds: *survivors* of a drained group (``park``: every process leaves the JAX runtime
together, in process, and waits), and *standbys* on spare hosts (started with nothing to do,
JAX imported). The next group ``take``s the process on each of its nodes and ``rejoin``s it;
whatever it does not take is killed (a parked process on a host the new mesh left out), except
standbys, which wait for a later re-form. Everything here is an optimisation: a process that
cannot be released or rejoined is killed and its group starts a fresh one on that node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import structlog
from ray.exceptions import RayActorError

from orchestrator.raygroup import preform
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec

log = structlog.get_logger(__name__)

REJOIN_TIMEOUT_S = 30.0
"""A standby still importing JAX answers its rejoin after the imports (a few seconds)."""
AHEAD_MARGIN_S = 2.0
"""Of a park's bound, what quiesce leaves for the releases after waiting for a compile ahead."""


@dataclass
class PoolStats:
    release_failed: int = 0


class WarmPool:
    """``start_standby(host)`` starts a process on ``host``'s node with nothing to do (the
    group's actor class with ``spec=None``) and returns its handle."""

    def __init__(self, *, start_standby: Callable[[HostRef], Any],
                 release_timeout_s: float = 20.0, warm_kwargs: dict | None = None) -> None:
        self.start_standby = start_standby
        self.warm_kwargs = dict(warm_kwargs or {})  # what a standby may prepare (``warm``)
        self.release_timeout_s = release_timeout_s
        self.parked: dict[str, Any] = {}
        self.standby: dict[str, Any] = {}
        self.warming: dict[str, Any] = {}  # node id -> the standby's ``warm`` call
        self.preformed: preform.Preformed | None = None  # standbys in a runtime of their own
        self.stats = PoolStats()

    def park(self, actors: Sequence[tuple[str, Any]], *, coordinator: str | None = None,
             timeout_s: float | None = None) -> int:
        """Release every (node id, actor) of one group and keep those that answered within
        ``timeout_s`` (default: the pool's); kill the rest. Returns how many were kept.

        The process on ``coordinator`` (process 0: it runs the runtime's coordination service)
        is released last: with ``jax_enable_recoverability`` the runtime's shutdown does not
        wait for the others, and a process whose shutdown finds the service gone aborts."""
        bound = self.release_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + bound
        # saves in flight may need every host: all finish them first, then leave in order
        t0 = time.perf_counter()
        # a compile ahead in flight is waited for within the bound; a process still compiling
        # then refuses its release and only it is replaced (the others have time to leave)
        self._call("quiesce", actors, deadline, ahead_wait_s=max(0.0, bound - AHEAD_MARGIN_S))
        t1 = time.perf_counter()
        first = [(n, a) for n, a in actors if n != coordinator]
        last = [(n, a) for n, a in actors if n == coordinator]
        answers = self._call("release", first, deadline)
        t2 = time.perf_counter()
        answers += self._call("release", last, deadline)
        log.info("park_timings", quiesce_s=round(t1 - t0, 3), release_others_s=round(t2 - t1, 3),
                 release_coordinator_s=round(time.perf_counter() - t2, 3))
        kept = 0
        for (node_id, actor), (ref, ready) in zip([*first, *last], answers, strict=True):
            try:
                if ref not in ready:
                    raise TimeoutError(f"release took over {bound:g} s")
                out = ray.get(ref)
            except RayActorError as exc:  # it died meanwhile: nothing failed to release
                log.info("not_kept_dead", node=node_id[:12], error=str(exc)[:200])
                _kill(actor)
                continue
            except Exception as exc:
                self.stats.release_failed += 1
                log.warning("release_failed", node=node_id[:12], error=str(exc)[:300])
                _kill(actor)
                continue
            log.info("released", node=node_id[:12],
                     **{k: round(float(v), 3) for k, v in out.items() if k.endswith("_s")})
            _kill(self.parked.pop(node_id, None))
            self.parked[node_id] = actor
            kept += 1
        return kept

    @staticmethod
    def _call(method: str, actors: Sequence[tuple[str, Any]], deadline: float, **kwargs: Any
              ) -> list[tuple[Any, list]]:
        """``method`` on every actor at once, waited for until ``deadline``: (ref, ready)."""
        refs = [getattr(a, method).remote(**kwargs) for _, a in actors]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs),
                            timeout=max(0.0, deadline - time.monotonic()))
        return [(ref, ready) for ref in refs]

    def acquire(self, wanted: Sequence[tuple[HostRef, dict[str, str], Any]],
                fresh: Callable[[HostRef, dict[str, str], Any], Any]) -> list[tuple[Any, str]]:
        """A process per (host, env, spec), in order, with its origin: the warm one on the
        host's node ``rejoin``ed ("parked" or "standby"), else ``fresh(host, env, spec)``
        ("fresh"; a warm process that failed to rejoin is killed first, which frees its node's
        TPU resource). Parked processes on nodes not wanted are killed."""
        warm = [self.take(h.node_id) for h, _, _ in wanted]
        self.drop_parked()  # processes on hosts this mesh left out
        rejoins = {i: w[0].rejoin.remote(spec, env)
                   for i, (w, (_, env, spec)) in enumerate(zip(warm, wanted, strict=True)) if w}
        ready, _ = ray.wait(list(rejoins.values()), num_returns=len(rejoins),
                            timeout=REJOIN_TIMEOUT_S) if rejoins else ([], [])
        out: list[tuple[Any, str]] = []
        for i, (h, env, spec) in enumerate(wanted):
            w = warm[i]
            if w is not None and _rejoined(rejoins[i], ready, h):
                out.append(w)
                continue
            _kill(w[0] if w is not None else None)
            out.append((fresh(h, env, spec), "fresh"))
        return out

    def take(self, node_id: str) -> tuple[Any, str] | None:
        """The warm process on ``node_id`` and its kind ("parked" or "standby"), or None."""
        if (actor := self.parked.pop(node_id, None)) is not None:
            return actor, "parked"
        if (actor := self.standby.pop(node_id, None)) is not None:
            self.warming.pop(node_id, None)
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
        if self.preformed is not None and any(n not in wanted for n in self.preformed.node_ids):
            self.drop_preformed()
        for node_id in [n for n in self.standby if n not in wanted]:
            _kill(self.standby.pop(node_id))
            self.warming.pop(node_id, None)
        started = 0
        for node_id, h in wanted.items():
            if node_id in self.standby:
                continue
            try:
                actor = self.start_standby(h)
                # not awaited: a rejoin queued behind it just waits
                self.warming[node_id] = actor.warm.remote(**self.warm_kwargs)
            except Exception as exc:  # a standby is an optimisation
                log.warning("standby_start_failed", node=node_id[:12], error=str(exc)[:300])
                continue
            self.standby[node_id] = actor
            started += 1
        return started

    def ready(self, node_ids: Sequence[str]) -> bool:
        """Whether the standbys on ``node_ids`` finished warming, and pre-forming where they
        are (a failed warm or pre-form counts as finished: a fresh process replaces it)."""
        pre = self.preformed
        if pre is not None and set(node_ids) & set(pre.node_ids) and not pre.done():
            return False
        if any(n not in self.standby for n in node_ids):
            return False
        refs = [self.warming[n] for n in node_ids if n in self.warming]
        if not refs:
            return True
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(done) == len(refs)

    def start_preform(self, specs: list[HostSpec], envs: list[dict[str, str]]) -> bool:
        """Pre-form the standbys on ``specs``' hosts as the group of ``specs``
        (``raygroup.preform``; not awaited). False when a host has no standby or the start
        failed (logged). A different pre-form is dropped first; the same one is kept."""
        pre = self.preformed
        if pre is not None and preform.matches(pre, specs, envs):
            return True
        nodes = [s.host.node_id for s in specs]
        if any(n not in self.standby for n in nodes):
            return False
        self.drop_preformed()
        try:
            self.preformed = preform.start([self.standby[n] for n in nodes], specs, envs)
        except Exception as exc:  # an optimisation: the standbys stay as they are
            log.warning("preform_not_started", error=str(exc)[:300])
            return False
        return True

    def adopt(self, specs: Sequence[HostSpec], envs: Sequence[dict[str, str]]
              ) -> list[Any] | None:
        """The pre-formed processes when a group of exactly ``specs`` and ``envs`` wants them
        and their pre-form succeeded (waited for while in flight); else None, and a pre-form
        on any of these hosts is dropped (its processes hold a runtime: they cannot rejoin)."""
        pre = self.preformed
        if pre is None:
            return None
        if not preform.matches(pre, specs, envs):
            if set(pre.node_ids) & {s.host.node_id for s in specs}:
                self.drop_preformed()
            return None
        if not pre.succeeded(preform.ADOPT_WAIT_S):
            self.drop_preformed()
            return None
        self.preformed = None
        for node_id in pre.node_ids:
            self.standby.pop(node_id, None)
            self.warming.pop(node_id, None)
        self.drop_parked()  # as ``acquire``: their nodes may get standbys now
        return pre.actors

    def drop_preformed(self) -> None:
        """Kill a pre-form's processes (its runtime is of no use to another mesh)."""
        pre, self.preformed = self.preformed, None
        if pre is None:
            return
        log.info("preform_dropped", hosts=len(pre.actors))
        for node_id, actor in zip(pre.node_ids, pre.actors, strict=True):
            self.standby.pop(node_id, None)
            self.warming.pop(node_id, None)
            _kill(actor)

    def close(self) -> None:
        """Kill every process kept here (the run is over)."""
        self.drop_preformed()
        self.drop_parked()
        for actor in self.standby.values():
            _kill(actor)
        self.standby, self.warming = {}, {}


def _rejoined(ref: Any, ready: list[Any], h: HostRef) -> bool:
    try:
        if ref not in ready:
            raise TimeoutError(f"no answer within {REJOIN_TIMEOUT_S:g} s")
        ray.get(ref)
        return True
    except Exception as exc:  # a warm process is an optimisation: start a fresh one
        log.warning("rejoin_failed", host=h.index, node=h.node_id[:12], error=str(exc)[:300])
        return False


def _kill(actor: Any) -> None:
    if actor is None:
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception as exc:  # already dead
        log.debug("kill_failed", error=str(exc))
