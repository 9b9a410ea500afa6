"""The simulated cluster: TPU-like hosts by slice, going away and coming back on world time.

A host position is (slice, worker). A host that comes back (repaired, slice re-created after a
preemption or maintenance) is a *new* host with a new node id and instance name, as a re-created
VM is: the controller never places on a node id it excluded, so reusing ids would hide capacity
from it. ``hosts()`` is the controller's ``ClusterView``; listeners hear of every loss (the
worker group, the checkpoint disk).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from orchestrator.shared.hosts import HostRef
from policies.causes import FailureKind

LossListener = Callable[[frozenset[str], FailureKind], None]


def slice_names(count: int) -> list[str]:
    """Zero-padded so sorted order is numeric order (placement sorts slice names)."""
    width = max(3, len(str(count - 1)))
    return [f"s{i:0{width}d}" for i in range(count)]


class SimCluster:
    def __init__(self, slices: Sequence[str], hosts_per_slice: int, devices: int) -> None:
        self.slices = list(slices)
        self.hosts_per_slice = hosts_per_slice
        self.devices = devices
        self._alive: dict[str, HostRef] = {}
        self._at: dict[tuple[str, int], str] = {}  # position -> node id alive there
        self._gen: dict[tuple[str, int], int] = {}
        self._cache: list[HostRef] | None = None
        self._counter = 0
        self.listeners: list[LossListener] = []
        self.on_return: list[Callable[[frozenset[str]], None]] = []
        for s in self.slices:
            self.add_slice(s)

    # ---- the ClusterView protocol ---------------------------------------------------------

    def hosts(self) -> list[HostRef]:
        if self._cache is None:
            self._cache = list(self._alive.values())
        return list(self._cache)

    def platform(self) -> str:
        return "tpu"

    def unreachable(self, node_ids: Collection[str]) -> set[str]:
        return {n for n in node_ids if n not in self._alive}

    # ---- the world's side -----------------------------------------------------------------

    def node_at(self, slice_name: str, worker: int) -> str | None:
        return self._at.get((slice_name, worker))

    def slice_nodes(self, slice_name: str) -> list[str]:
        return [n for w in range(self.hosts_per_slice)
                if (n := self._at.get((slice_name, w))) is not None]

    def slice_complete(self, slice_name: str) -> bool:
        return len(self.slice_nodes(slice_name)) == self.hosts_per_slice

    def add_host(self, slice_name: str, worker: int) -> str | None:
        """A (new) host at this position; None if one is there already."""
        pos = (slice_name, worker)
        if pos in self._at:
            return None
        gen = self._gen.get(pos, -1) + 1
        self._gen[pos] = gen
        self._counter += 1
        node = f"{slice_name}-w{worker}-g{gen}"
        self._alive[node] = HostRef(
            index=self._counter, slice_name=slice_name, worker_id=worker, node_id=node,
            node_ip=f"10.{self._counter // 65536 % 256}.{self._counter // 256 % 256}."
                    f"{self._counter % 256}",
            instance=f"vm-{node}", devices=self.devices)
        self._at[pos] = node
        self._cache = None
        return node

    def add_slice(self, slice_name: str) -> frozenset[str]:
        added = {n for w in range(self.hosts_per_slice)
                 if (n := self.add_host(slice_name, w)) is not None}
        if added:
            for fn in self.on_return:
                fn(frozenset(added))
        return frozenset(added)

    def return_host(self, slice_name: str, worker: int) -> None:
        node = self.add_host(slice_name, worker)
        if node is not None:
            for fn in self.on_return:
                fn(frozenset({node}))

    def remove(self, node_ids: Collection[str], kind: FailureKind) -> frozenset[str]:
        """Take hosts away (and tell the listeners); returns the ones that were alive."""
        gone = frozenset(n for n in node_ids if n in self._alive)
        if not gone:
            return gone
        for n in gone:
            h = self._alive.pop(n)
            self._at.pop((h.slice_name, h.worker_id), None)
        self._cache = None
        for fn in self.listeners:
            fn(gone, kind)
        return gone

    def remove_slice(self, slice_name: str, kind: FailureKind) -> frozenset[str]:
        return self.remove(self.slice_nodes(slice_name), kind)
