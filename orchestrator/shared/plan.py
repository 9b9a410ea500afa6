"""The mesh plan: which hosts form the JAX group, in which order, with which mesh shape.

Pure data and arithmetic (no Ray, no JAX) so it is unit-tested for many topologies and shipped to
the host actors as is. Process ids follow (slice order, worker id): the DCN axis splits by slice,
the ICI axes stay inside one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.shared.errors import TopologyError
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.sections import MeshShape

DEFAULT_MEGASCALE_PORT = "8081"
MEGASCALE_KEYS = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_PORT", "MEGASCALE_NUM_SLICES",
                  "MEGASCALE_SLICE_ID")
"""The multislice keys a plan owns: a host process drops any of them its new plan does not set
(a process reused from a 2-slice group, or a node env naming another mesh, would otherwise hand
libtpu a stale coordinator and slice count: an init that hangs)."""


@dataclass(frozen=True, kw_only=True)
class MeshPlan:
    hosts: tuple[HostRef, ...]
    """In process-id order; ``hosts[i].index == i``."""
    slice_names: tuple[str, ...]
    shape: MeshShape
    devices_per_host: int
    platform: str
    """"tpu" or "cpu" (emulated)."""

    @property
    def num_processes(self) -> int:
        return len(self.hosts)

    @property
    def num_slices(self) -> int:
        return len(self.slice_names)

    @property
    def hosts_per_slice(self) -> int:
        return self.num_processes // self.num_slices

    @property
    def devices(self) -> int:
        return self.num_processes * self.devices_per_host

    def slice_id(self, host: HostRef) -> int:
        return self.slice_names.index(host.slice_name)

    def megascale_env(self, host: HostRef, *, coordinator_ip: str,
                      port: str = DEFAULT_MEGASCALE_PORT) -> dict[str, str]:
        """MEGASCALE_* for multislice on TPU (the same keys ray.util.tpu computes); {} otherwise."""
        if self.platform != "tpu" or self.num_slices < 2:
            return {}
        values = (coordinator_ip, port, str(self.num_slices), str(self.slice_id(host)))
        return dict(zip(MEGASCALE_KEYS, values, strict=True))

    def describe(self) -> dict:
        return {"slices": list(self.slice_names), "hosts": self.num_processes,
                "devices_per_host": self.devices_per_host, "platform": self.platform,
                "mesh": self.shape.as_dict()}


def plan_mesh(cfg: Any, hosts: Sequence[HostRef], *, platform: str,
              hosts_per_slice: int | None = None, max_slices: int | None = None) -> MeshPlan:
    """Group hosts by slice, keep whole slices only, order them, and resolve the mesh shape
    (``cfg`` the driver's ``RunConfig``: its ``validate_for`` resolves the shape).

    A slice with fewer than ``hosts_per_slice`` hosts (default: the largest slice's count) is
    incomplete (a host is missing) and is left out; ``max_slices`` caps how many slices are used.
    """
    by_slice: dict[str, list[HostRef]] = {}
    for h in hosts:
        by_slice.setdefault(h.slice_name, []).append(h)
    if not by_slice:
        raise TopologyError(
            "No hosts are available to form a mesh.",
            fix="add TPU nodes to the Ray cluster, or run with cluster.mode=emulate")
    full = hosts_per_slice or max(len(v) for v in by_slice.values())
    complete = sorted(name for name, v in by_slice.items() if len(v) >= full)
    if not complete:
        raise TopologyError(f"No slice has all {full} of its hosts available.",
                            fix="wait for the slice to be repaired or add a replacement slice")
    if max_slices is not None:
        complete = complete[:max_slices]
    devices = {h.devices for name in complete for h in by_slice[name]}
    if len(devices) != 1:
        raise TopologyError(f"Hosts disagree on their device count ({sorted(devices)}).",
                            fix="use one TPU type per run (one accelerator per worker group)")
    dph = devices.pop()
    shape = cfg.validate_for(slices=len(complete), hosts_per_slice=full, devices_per_host=dph)
    ordered: list[HostRef] = []
    for name in complete:
        for h in sorted(by_slice[name], key=lambda x: x.worker_id)[:full]:
            ordered.append(HostRef(index=len(ordered), slice_name=h.slice_name,
                                   worker_id=h.worker_id, node_id=h.node_id, node_ip=h.node_ip,
                                   instance=h.instance, devices=h.devices))
    return MeshPlan(hosts=tuple(ordered), slice_names=tuple(complete), shape=shape,
                    devices_per_host=dph, platform=platform)
