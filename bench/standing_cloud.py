"""The cloud of the standing-cluster goodput figure: preemptions on a standing local TPU-like
cluster (``orchestrator.cluster up``), the same for every system.

A preemption of a slice is what Ray learns from a real one: every host of the slice is drained
through Ray Core (reason preemption, the notice's deadline: what ``ray drain-node``, KubeRay and
the autoscaler send, and what both the orchestrator's intake and Ray Train's
``PreemptionWatcher`` read). At the deadline the slice's hosts vanish (every process SIGKILLed),
and a new slice of the same shape joins ``replace_after_s`` later. The schedule is the
orchestrator's own pure ``CapacitySchedule``; joins run on a thread (a host takes seconds to
start) so notices are never late.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from orchestrator.cluster import local
from orchestrator.cluster.cloud import CapacitySchedule

log = structlog.get_logger(__name__)

PREEMPTION = "DRAIN_NODE_REASON_PREEMPTION"


def drain_node(gcs_address: str, node_id: str, deadline: float) -> tuple[bool, str]:
    """Ray Core's drain of one node with reason preemption and ``deadline`` (epoch seconds)."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    gcs = GcsClient(address=gcs_address)
    return gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value(PREEMPTION),
                          "spot reclaim (bench)", int(deadline * 1000))


@dataclass
class StandingCloud:
    """Preempts slices of the cluster recorded in ``state_dir`` and brings replacements."""

    state_dir: Path
    deadline_s: float
    replace_after_s: float
    slices: int
    """Complete slices the cluster has when nothing is preempted (restored between systems)."""
    log: list[dict] = field(default_factory=list)
    _schedule: CapacitySchedule = field(init=False)
    _joins: list[threading.Thread] = field(default_factory=list)
    _draining: set[str] = field(default_factory=set)
    _removed: set[str] = field(default_factory=set)
    """Slices whose hosts were killed: Ray's node table lists them alive for a while after."""
    _next: int = 0

    def __post_init__(self) -> None:
        self._schedule = CapacitySchedule(replace_after_s=self.replace_after_s)
        self._next = len(self.alive())

    def state(self) -> local.ClusterState:
        state = local.load_state(self.state_dir)
        if state is None:
            raise RuntimeError(f"no standing cluster recorded in {self.state_dir}")
        return state

    def alive(self) -> dict[str, list[dict[str, str]]]:
        return local.slice_nodes(self.state())

    def healthy(self) -> list[str]:
        """Complete slices not being drained: what a job may be (re)started on."""
        per = int(self.state().shape["hosts_per_slice"])
        return [s for s, hosts in self.alive().items()
                if len(hosts) == per and s not in self._draining | self._removed]

    def preempt(self, slice_name: str, *, now: float | None = None) -> dict:
        """Drain every host of ``slice_name``; it goes at the deadline, a new slice comes later."""
        now = time.time() if now is None else now
        deadline = now + self.deadline_s
        state = self.state()
        hosts = self.alive().get(slice_name, [])
        drains = [(h["node_id"], *drain_node(state.gcs_address, h["node_id"], deadline))
                  for h in hosts]
        self._draining.add(slice_name)
        self._schedule.preempted([slice_name], deadline=deadline, now=now)
        rec = {"event": "preempt", "slice": slice_name, "at": now, "deadline": deadline,
               "drains": [{"node_id": n, "accepted": ok, "why": why} for n, ok, why in drains]}
        self.log.append(rec)
        return rec

    def tick(self, now: float | None = None) -> None:
        """Apply what is due: a reclaimed slice's hosts vanish, a replacement starts joining."""
        now = time.time() if now is None else now
        for action in self._schedule.due(now):
            if action.kind == "reclaim":
                self._remove(action.slice_name, now)
            else:
                self._add(now)

    def _remove(self, slice_name: str, now: float) -> None:
        try:
            gone = local.remove_slice(slice_name, state_dir=self.state_dir)
        except local.LocalClusterError as exc:
            gone = []
            log.warning("bench_cloud_remove_failed", slice=slice_name, error=str(exc))
        self._draining.discard(slice_name)
        self._removed.add(slice_name)
        self.log.append({"event": "reclaim", "slice": slice_name, "at": now, "hosts": gone})

    def _add(self, now: float) -> None:
        prefix = self.state().shape.get("name_prefix", "local-slice")
        name = f"{prefix}-{self._next}"
        self._next += 1
        self.log.append({"event": "replace", "slice": name, "at": now})

        def join() -> None:
            try:
                local.add_slice(name, state_dir=self.state_dir)
                self.log.append({"event": "joined", "slice": name, "at": time.time()})
            except Exception as exc:  # the next system's restore() retries
                log.warning("bench_cloud_add_failed", slice=name, error=str(exc))

        t = threading.Thread(target=join, name=f"join-{name}", daemon=True)
        t.start()
        self._joins.append(t)

    def restore(self, timeout_s: float = 300.0) -> None:
        """Between systems: pending reclaims now, joins finished, then new slices until the
        cluster has ``slices`` healthy ones again. Pending replacements are dropped."""
        now = time.time()
        for action in self._schedule.due(float("inf")):
            if action.kind == "reclaim":
                self._remove(action.slice_name, now)
        for t in self._joins:
            t.join(timeout=timeout_s)
        self._joins.clear()
        deadline = time.monotonic() + timeout_s
        # the next system must not see a removed slice's nodes as alive (a planner would count
        # it, and the node watcher report its death later as if it were the run's)
        while set(self.alive()) & self._removed:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray still lists removed slices {sorted(self._removed)}")
            time.sleep(1.0)
        while len(self.healthy()) < self.slices:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standing cluster has {self.healthy()} healthy slices, "
                                   f"needs {self.slices}")
            self._add(time.time())
            for t in self._joins:
                t.join(timeout=timeout_s)
            self._joins.clear()
