"""Which hosts of the run an event really names: one pure resolver for the intake's verdict, the
controller's reaction and ``explain``.

An event is matched only through the field that names a host for its source (``Target.host_kind``):
a GCE instance name against ``HostRef.instance``, a numeric instance id through the id -> name map
the hosts read from their metadata servers at start, a GKE node name against the instance (GKE
names nodes like their VMs), a TPU worker id within its slice, a Ray node id, an IP. Only operator
input (``host_kind`` None) may name a host by any of those or by its mesh index. An event that
names no host and no slice is job-wide only when it is the operator's (no cluster named) or its
resource is this job's cluster; otherwise it is not for this mesh, and ``reason`` says why. (An
event that names a host is matched by the host alone: node names are unique in a project.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.shared.hosts import HostRef


@dataclass(frozen=True)
class Targeting:
    """``node_ids``: Ray node ids of the hosts the event names; ``job_wide``: the event is about
    the whole job (treat every mesh host as named); neither: not for this mesh (``reason``)."""

    node_ids: frozenset[str]
    job_wide: bool
    reason: str

    @property
    def for_this_mesh(self) -> bool:
        return self.job_wide or bool(self.node_ids)


def resolve_targets(event: Any, hosts: Sequence[HostRef], *,
                    id_to_name: Mapping[str, str] | None = None,
                    cluster: str | None = None) -> Targeting:
    """Resolve ``event.target`` against ``hosts`` (pure; ``cluster`` = this job's cluster name)."""
    t = event.target
    named_cluster = getattr(t, "cluster", None)
    if t.host is None and t.slice is None:
        if named_cluster is None:
            return Targeting(frozenset(), True, "names no host or slice: the whole job")
        if cluster is not None and named_cluster != cluster:
            return Targeting(frozenset(), False, f"resource is cluster {named_cluster!r}, not "
                             f"this job's cluster {cluster!r}")
        if cluster is None:
            return Targeting(frozenset(), False,
                             f"names only cluster {named_cluster!r} and this job's cluster is "
                             "not known (set events.cluster)")
        return Targeting(frozenset(), True, f"resource is this job's cluster {cluster!r}")
    in_slice = [h for h in hosts if t.slice is None or h.slice_name == t.slice]
    if t.host is None:
        ids = frozenset(h.node_id for h in in_slice)
        return Targeting(ids, False, f"slice {t.slice!r}" if ids
                         else f"slice {t.slice!r} has no host in the mesh")
    kind = getattr(t, "host_kind", None)
    name = str(t.host)
    if kind == "instance_id":
        mapped = (id_to_name or {}).get(name)
        if mapped is None:
            return Targeting(frozenset(), False,
                             f"instance id {name} is not one of the run's hosts (id -> name map "
                             f"has {len(id_to_name or {})} entries)")
        kind, name = "instance", mapped
    matched = frozenset(h.node_id for h in in_slice if _matches(h, kind, name))
    where = f" in slice {t.slice!r}" if t.slice is not None else ""
    label = kind or "host"
    if not matched:
        return Targeting(frozenset(), False, f"{label} {name!r}{where} is not in the mesh")
    return Targeting(matched, False, f"{label} {name!r}{where}")


def _matches(h: HostRef, kind: str | None, name: str) -> bool:
    if kind in ("instance", "node_name"):
        return h.instance == name
    if kind == "tpu_worker":
        return str(h.worker_id) == name
    if kind == "ray_node":
        return h.node_id == name
    if kind == "ip":
        return h.node_ip == name
    if kind == "index":
        return str(h.index) == name
    if kind is None:  # operator input: any name the operator can see
        return name in (h.instance, h.node_id, h.node_ip, str(h.index))
    return False
