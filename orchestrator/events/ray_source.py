"""Ray as an event source: the run's hosts whose Ray node died become HOST_LOST events, and nodes
Ray Core is draining become PREEMPTION_NOTICE events with the drain's deadline.

``RayNodeWatcher`` polls the cluster's node table (a seam, ``ray.nodes`` by default) and reports
mesh hosts whose node is no longer alive, once per node. It also polls Ray Core's draining nodes
(``ray drain-node``, KubeRay, the autoscaler; what Ray Train's ``PreemptionWatcher`` polls): a
drain is a preemption notice for that node, targeted by Ray node id (Ray exposes no reason while
a drain is under way and refuses an idle-termination drain of a node running actors); the
intake decides whether it concerns the run. Ray has no public API for its draining nodes: the
caller passes ``draining`` (the driver: ``orchestrator.raygroup.ray_private.draining_nodes``,
pinned by ``tests/test_private_apis.py``), so events import nothing of ``raygroup``. A failed
*call* on a host actor is not an event: the worker group maps it to the seam's ``FailureKind``
(``orchestrator.raygroup.results``, the one place a Ray exception is classified) and the
controller takes its failure path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from orchestrator.events.model import Event, EventKind, Target
from orchestrator.shared.hosts import HostRef

log = structlog.get_logger(__name__)

SOURCE = "ray"


def node_lost_event(host: HostRef, *, job: str | None = None, now: float,
                    state: str = "DEAD") -> Event:
    return Event(
        kind=EventKind.HOST_LOST,
        target=_target(host, job),
        source=SOURCE, id=f"ray:node_dead:{host.node_id}", observed_at=now,
        message=f"Ray node {host.node_id} of host {host.index} is {state}",
        labels={"ray.node_id": host.node_id, "ray.node_state": state,
                "host.index": str(host.index)},
    )


def _target(host: HostRef, job: str | None) -> Target:
    """Ray names a host by its node id (the instance name when the id is unknown)."""
    if host.node_id:
        return Target(job=job, slice=host.slice_name, host=host.node_id, host_kind="ray_node")
    return Target(job=job, slice=host.slice_name, host=host.instance, host_kind="instance")


def drain_event(node_id: str, deadline_ms: int, *, job: str | None, now: float,
                host: HostRef | None) -> Event:
    """Ray Core drains ``node_id`` (deadline 0: none given): a preemption notice for it."""
    deadline = deadline_ms / 1000.0 if deadline_ms else None
    return Event(
        kind=EventKind.PREEMPTION_NOTICE,
        target=Target(job=job, slice=host.slice_name if host else None, host=node_id,
                      host_kind="ray_node"),
        source=SOURCE, id=f"ray:drain:{node_id}:{deadline_ms}", observed_at=now,
        deadline=deadline, message=f"Ray Core is draining node {node_id}"
        + (f" (deadline in {deadline - now:.0f}s)" if deadline else " (no deadline)"),
        labels={"ray.node_id": node_id, "ray.drain_deadline_ms": str(deadline_ms)},
    )


def ray_nodes() -> list[dict[str, Any]]:
    """The default seam: Ray's node table (needs ``ray.init`` in this process)."""
    import ray

    return list(ray.nodes())


class RayNodeWatcher:
    """Reports run hosts whose Ray node died; optionally as a polling thread feeding ``submit``."""

    def __init__(self, *, job: str | None = None,
                 nodes: Callable[[], list[dict[str, Any]]] = ray_nodes,
                 draining: Callable[[], dict[str, int]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.job = job
        self._nodes = nodes
        self._draining = draining
        self._drains: set[tuple[str, int]] = set()
        self._clock = clock
        self._reported: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, hosts: Sequence[HostRef]) -> list[Event]:
        """HOST_LOST for each host whose node is listed dead or no longer listed (once each)."""
        try:
            table = self._nodes()
        except Exception as exc:  # GCS unreachable: say so, report nothing
            log.warning("ray_node_table_unavailable", error=str(exc)[:300])
            return []
        alive = {str(n.get("NodeID")) for n in table if n.get("Alive")}
        known = {str(n.get("NodeID")): n for n in table}
        out = []
        now = self._clock()
        for host in hosts:
            if host.node_id in alive or host.node_id in self._reported:
                continue
            state = "DEAD" if host.node_id in known else "MISSING"
            self._reported.add(host.node_id)
            out.append(node_lost_event(host, job=self.job, now=now, state=state))
        return out + self.check_drains(hosts)

    def check_drains(self, hosts: Sequence[HostRef]) -> list[Event]:
        """A PREEMPTION_NOTICE per (node, deadline) Ray Core drains, once each; the intake
        decides relevance (a node of ours or a spare: targeted by Ray node id)."""
        if self._draining is None:
            return []
        try:
            drains = self._draining()
        except Exception as exc:  # GCS unreachable, or the private accessor moved
            log.warning("ray_draining_nodes_unavailable", error=str(exc)[:300])
            return []
        by_node = {h.node_id: h for h in hosts}
        now = self._clock()
        out = []
        for node_id, deadline_ms in sorted(drains.items()):
            key = (str(node_id), int(deadline_ms or 0))
            if key in self._drains:
                continue
            self._drains.add(key)
            log.info("ray_node_draining", node=key[0], deadline_ms=key[1],
                     ours=key[0] in by_node)
            out.append(drain_event(key[0], key[1], job=self.job, now=now,
                                   host=by_node.get(key[0])))
        return out

    def start(self, submit: Callable[[Event], None], hosts: Callable[[], Sequence[HostRef]],
              interval_s: float = 1.0) -> None:
        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    for event in self.check(hosts()):
                        submit(event)
                except Exception:
                    log.exception("ray_node_watch_failed")

        self._thread = threading.Thread(target=run, name="events-ray-nodes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
