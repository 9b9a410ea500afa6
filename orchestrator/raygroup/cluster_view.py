"""The cluster as Ray shows it: TPU hosts alive now, whether a node still answers, and a host
actor pinned to its node (the seam's ``ClusterView`` and the placement every group uses)."""

from __future__ import annotations

import socket
import time
from collections.abc import Collection
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec

log = structlog.get_logger(__name__)


class RayClusterView:
    """``ray.nodes()`` read as TPU hosts."""

    probe_timeout_s: float = 2.0

    def hosts(self) -> list[HostRef]:
        from orchestrator.raygroup.topology import hosts_from_nodes

        return hosts_from_nodes(ray.nodes())

    def platform(self) -> str:
        from orchestrator.raygroup.topology import platform_of

        return platform_of(ray.nodes())

    def unreachable(self, node_ids: Collection[str]) -> set[str]:
        """Nodes that are gone even if the GCS has not noticed yet (it marks a vanished node
        dead only after its health checks fail, seconds later): dead, unknown, or their raylet
        refuses a TCP connection."""
        wanted = set(node_ids)
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["NodeID"] in wanted}
        gone = wanted - set(nodes)
        for node_id, n in nodes.items():
            if not n.get("Alive") or not accepts(n.get("NodeManagerAddress", ""),
                                                  int(n.get("NodeManagerPort", 0)),
                                                  self.probe_timeout_s):
                gone.add(node_id)
        return gone


def wait_listening(host: str, port: int, *, timeout_s: float) -> bool:
    """Whether ``host:port`` accepts a TCP connection within ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if accepts(host, port, 0.2):
            return True
        time.sleep(0.01)
    return False


def accepts(host: str, port: int, timeout_s: float) -> bool:
    if not host or port <= 0:
        return True  # nothing to probe: trust the GCS
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def spawn(actor_cls: Any, h: HostRef, env: dict[str, str], spec: HostSpec | None) -> Any:
    """A host actor pinned to ``h``'s node, holding its TPU resource (``spec`` None: a
    standby that ``rejoin`` gives a host later)."""
    return actor_cls.options(
        name=None, num_cpus=0, resources={"TPU": h.devices}, max_concurrency=4,
        max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id=h.node_id, soft=False),
        runtime_env={"env_vars": env},
    ).remote(spec, env)


def dead_hosts(actors: list[Any], timeout_s: float = 3.0) -> tuple[int, ...]:
    """Indices of actors that are gone (a collective error on a survivor often arrives before
    the dead peer's ActorDiedError)."""
    refs = [a.info.remote() for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    dead = []
    for i, ref in enumerate(refs):
        if ref not in ready:
            continue  # alive but busy (or hung): not dead
        try:
            ray.get(ref)
        except (ActorDiedError, ActorUnavailableError, RayActorError):
            dead.append(i)
        except Exception as exc:  # any other answer means the process is there
            log.debug("probe_error", host=i, error=str(exc))
    return tuple(dead)
