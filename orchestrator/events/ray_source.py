"""Ray as an event source: the run's hosts whose Ray node died become HOST_LOST events.

``RayNodeWatcher`` polls the cluster's node table (a seam, ``ray.nodes`` by default) and reports
mesh hosts whose node is no longer alive, once per node. A failed *call* on a host actor is not
an event: the worker group maps it to the seam's ``FailureKind`` (``orchestrator.ray_results``,
the one place a Ray exception is classified) and the controller takes its failure path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from orchestrator.events.model import Event, EventKind, Target
from orchestrator.hosts import HostRef

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


def ray_nodes() -> list[dict[str, Any]]:
    """The default seam: Ray's node table (needs ``ray.init`` in this process)."""
    import ray

    return list(ray.nodes())


class RayNodeWatcher:
    """Reports run hosts whose Ray node died; optionally as a polling thread feeding ``submit``."""

    def __init__(self, *, job: str | None = None,
                 nodes: Callable[[], list[dict[str, Any]]] = ray_nodes,
                 clock: Callable[[], float] = time.time) -> None:
        self.job = job
        self._nodes = nodes
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
