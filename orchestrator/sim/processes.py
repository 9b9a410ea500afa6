"""The world's happenings: failure and event processes, drawn up front, acted out on the world.

Each process (host failures, slice losses, preemptions, maintenance) has its own seeded
generator, so changing one rate, the checkpoint interval or the spares leaves the others' draws
where they were (common random numbers across a sweep). A happening names a *position* (slice
index, worker); acting it out takes whatever host is alive there then (a failure of a host that
is already gone is a no-op: the rate is per *live* host-hour). Notices reach the controller the
way real ones do: a payload submitted to the run's ``EventIntake``. Lost capacity comes back as
new hosts after the capacity model's delay.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.sim.cluster import SimCluster
from orchestrator.sim.config import SimConfig
from orchestrator.sim.models import draw_delay
from orchestrator.sim.world import World
from policies.causes import FailureKind


@dataclass(frozen=True, kw_only=True)
class Happening:
    """``t``: seconds after the start. ``worker`` None: the whole slice; ``slice_index`` None:
    the whole job (trace only). ``mesh_index`` (trace only): the host at that index of the mesh
    when it happens, as the intake resolves our CLI's ``--host 1``. ``back_s``: how long the
    capacity stays away."""

    t: float
    kind: str  # host_failure | slice_loss | preemption | maintenance | notice (trace)
    slice_index: int | None
    worker: int | None = None
    back_s: float = 0.0
    notice: bool = True
    lead_s: float = 0.0  # preemption: notice; maintenance: announcement to window start
    duration_s: float = 0.0  # maintenance window
    event_kind: str = ""  # trace: the event kind to submit
    event_id: str = ""
    effect: bool = True
    mesh_index: int | None = None


def _rng(cfg: SimConfig, name: str) -> random.Random:
    return random.Random(f"{cfg.seed}:{name}")


def _poisson(rng: random.Random, rate_per_s: float, horizon_s: float) -> list[float]:
    out: list[float] = []
    if rate_per_s <= 0:
        return out
    t = rng.expovariate(rate_per_s)
    while t < horizon_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def generate(cfg: SimConfig, n_slices: int) -> list[Happening]:
    """Every random happening over the horizon, in time order."""
    f, cap, hps = cfg.failures, cfg.capacity, cfg.topology.hosts_per_slice
    horizon = cfg.horizon_h * 3600.0
    out: list[Happening] = []
    rng = _rng(cfg, "host_failure")
    for t in _poisson(rng, f.host_per_hour / 3600.0 * n_slices * hps, horizon):
        out.append(Happening(t=t, kind="host_failure", slice_index=rng.randrange(n_slices),
                             worker=rng.randrange(hps), back_s=draw_delay(cap.host_repair, rng)))
    rng = _rng(cfg, "slice_loss")
    for t in _poisson(rng, f.slice_loss_per_hour / 3600.0 * n_slices, horizon):
        out.append(Happening(t=t, kind="slice_loss", slice_index=rng.randrange(n_slices),
                             back_s=draw_delay(cap.slice_return, rng)))
    rng = _rng(cfg, "preemption")
    for t in _poisson(rng, f.preemption_per_slice_hour / 3600.0 * n_slices, horizon):
        out.append(Happening(t=t, kind="preemption", slice_index=rng.randrange(n_slices),
                             back_s=draw_delay(cap.slice_return, rng),
                             notice=rng.random() >= f.notice_missed_fraction,
                             lead_s=f.preemption_notice_s))
    rng = _rng(cfg, "maintenance")
    for t in _poisson(rng, f.maintenance_per_slice_hour / 3600.0 * n_slices, horizon):
        out.append(Happening(t=t, kind="maintenance", slice_index=rng.randrange(n_slices),
                             lead_s=f.maintenance_lead_h * 3600.0,
                             duration_s=f.maintenance_duration_s))
    rng = _rng(cfg, "unhealthy")
    for t in _poisson(rng, f.unhealthy_per_host_hour / 3600.0 * n_slices * hps, horizon):
        s, w = rng.randrange(n_slices), rng.randrange(hps)
        out += [Happening(t=t + 30.0 * i, kind="notice", event_kind="host_unhealthy",
                          slice_index=s, worker=w) for i in range(f.unhealthy_reports)]
    return sorted(out, key=lambda h: h.t)


class Actor:
    """Acts happenings out on the world, the cluster and the intake."""

    def __init__(self, cfg: SimConfig, world: World, cluster: SimCluster, *, job: str,
                 submit: Callable[[dict], None], delivered: Callable[[str], None],
                 mesh_slices: Callable[[], list[str]]) -> None:
        self.cfg, self.world, self.cluster, self.job = cfg, world, cluster, job
        self.submit, self.delivered, self.mesh_slices = submit, delivered, mesh_slices
        self.down_until: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.rng = _rng(cfg, "trace_capacity")
        self._n = 0

    def install(self, happenings: list[Happening]) -> None:
        for h in happenings:
            self.world.at(self.world.start + h.t, h.kind, lambda h=h: self.act(h))

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def _slices(self, h: Happening) -> list[str]:
        if h.slice_index is None:
            return self.mesh_slices()
        return [self.cluster.slices[h.slice_index % len(self.cluster.slices)]]

    def _at_mesh_index(self, h: Happening) -> Happening | None:
        """A host named by mesh index -> its slice and worker in the mesh of this moment."""
        assert h.mesh_index is not None
        mesh, hps = self.mesh_slices(), self.cfg.topology.hosts_per_slice
        s, w = divmod(h.mesh_index, hps)
        if s >= len(mesh) or mesh[s] not in self.cluster.slices:
            self._count("trace_index_outside_mesh")
            return None
        return replace(h, slice_index=self.cluster.slices.index(mesh[s]), worker=w,
                       mesh_index=None)

    def act(self, h: Happening) -> None:
        if h.mesh_index is not None:
            resolved = self._at_mesh_index(h)
            if resolved is None:
                return
            h = resolved
        now = self.world.t
        names = self._slices(h)
        if h.kind == "host_failure":
            node = self.cluster.node_at(names[0], h.worker or 0)
            if node is not None:
                self._count("host_failure")
                self.cluster.remove([node], FailureKind.NODE_DIED)
                self.world.at(now + h.back_s, "host_repaired",
                              lambda: self._return_host(names[0], h.worker or 0))
            return
        if h.kind == "slice_loss":
            for name in names:
                self._take(name, now, now + h.back_s, FailureKind.SLICE_LOST, "slice_loss")
            return
        if h.kind == "preemption":
            if not any(self.cluster.slice_nodes(n) for n in names):
                return
            if h.notice and self.cfg.failures.notices_read:
                self._notice("preemption_notice", names, h, deadline=now + h.lead_s,
                             host=self._host(names, h))
            else:
                self._count("preemption_notice_missed" if not h.notice else "notice_unread")
            if not h.effect:
                return
            self.world.at(now + h.lead_s, "preempted", lambda: [
                self._take(n, self.world.t, self.world.t + h.back_s, FailureKind.NODE_DIED,
                           "preempted") for n in names])
            return
        if h.kind == "maintenance":
            start, end = now + h.lead_s, now + h.lead_s + h.duration_s
            if self.cfg.failures.notices_read:
                self._notice("maintenance_scheduled", names, h, deadline=start,
                             window=(start, end), host=self._host(names, h))
            else:
                self._count("notice_unread")
            if not h.effect:
                return
            self.world.at(start, "maintenance_window", lambda: [
                self._take(n, start, end, FailureKind.NODE_DIED, "maintenance") for n in names])
            return
        if h.kind == "notice":  # a replayed event with no effect on capacity
            self._notice(h.event_kind, names if h.slice_index is not None else [""], h,
                         deadline=None, host=self._host(names, h))
            return
        raise ValueError(f"unknown happening kind {h.kind!r}")

    def _host(self, names: list[str], h: Happening) -> str | None:
        """The instance name now alive at the happening's position (host-level events)."""
        if h.worker is None or h.slice_index is None:
            return None
        node = self.cluster.node_at(names[0], h.worker)
        return f"vm-{node}" if node is not None else f"vm-{names[0]}-w{h.worker}-gone"

    def _take(self, name: str, now: float, until: float, kind: FailureKind, what: str) -> None:
        gone = self.cluster.remove_slice(name, kind)
        if gone:
            self._count(what)
        if until > self.down_until.get(name, 0.0):
            self.down_until[name] = until
            self.world.at(until, "slice_returned", lambda: self._return_slice(name, until))

    def _return_slice(self, name: str, until: float) -> None:
        if self.down_until.get(name) == until:
            self.down_until.pop(name, None)
            if self.cluster.add_slice(name):
                self._count("slice_returned")
                self.delivered("capacity_returned")

    def _return_host(self, name: str, worker: int) -> None:
        if name in self.down_until:
            return  # the whole slice is away; it comes back whole
        self.cluster.return_host(name, worker)
        self._count("host_repaired")
        self.delivered("capacity_returned")

    def _notice(self, kind: str, names: list[str], h: Happening, *, deadline: float | None,
                window: tuple[float, float] | None = None, host: str | None = None) -> None:
        self._n += 1
        for name in names:
            target: dict = {"job": self.job, "slice": name} if name else {"job": self.job}
            if host is not None:
                target = {"job": self.job, "host": host, "host_kind": "instance"}
            payload = {"schema_version": 1, "kind": kind, "source": "sim", "target": target,
                       "id": h.event_id or f"sim-{kind}-{name}-{self._n}",
                       "observed_at": self.world.t, "deadline": deadline}
            if h.event_id and len(names) > 1:
                payload["id"] = f"{h.event_id}-{name}"
            if window is not None:
                payload["window_start"], payload["window_end"] = window
            self.submit(payload)
            self._count(kind)
        self.delivered(kind)
