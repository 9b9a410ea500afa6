"""The simulated worker group: the controller's ``WorkerGroup`` seam on world time.

Hosts step back to back at the step-time model's pace; a save step blocks the loop for the
tier's blocking time and commits in the background ``save_commit_s`` later (the controller only
ever hears of *committed* steps, as from Orbax). A host that dies makes its peers' collective
fail ``reform.detect_s`` later: the chunk returns ``HostsLost`` with the step reached when the
host died, a phase call raises ``GroupFailed``; saves not committed by then never commit.
Phase calls take the re-form model's time. Every seam call is a ``Probe`` boundary.

It implements the core ``WorkerGroup`` only: none of the optional capabilities (warm standby
processes, a RAM tier, compile-ahead, chaos faults), so the controller drains at once, saves
durably and compiles every group's step, as on a TPU fleet without them.

``spans`` holds one ``StepSpan`` per chunk (exact, since every committed step ends a chunk), so
goodput's lost-step accounting is exact, not estimated.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from orchestrator.controller.seam import (
    Compiled,
    Formed,
    GroupFailed,
    GroupSpec,
    HostsLost,
    Hung,
    Progress,
    Restored,
    Running,
    Saved,
)
from orchestrator.metrics.ledger import StepSpan
from orchestrator.sim import models
from orchestrator.sim.cluster import SimCluster
from orchestrator.sim.config import SimConfig
from orchestrator.sim.disk import EPS as _EPS
from orchestrator.sim.disk import Disk, Save
from orchestrator.sim.world import Probe, World
from policies.causes import FailureKind

STOP_MARGIN_STEPS = 2  # as RayWorkerGroup: stop two steps past the furthest host
RECORDS_PER_CHUNK = 32  # host 0's newest records per chunk (+ every save step's record)


class SimFleet:
    """The group factory, and what outlives a group: the disk, the spans, the world hooks."""

    def __init__(self, cfg: SimConfig, world: World, cluster: SimCluster, probe: Probe,
                 costs: models.Costs) -> None:
        self.cfg, self.world, self.cluster, self.probe, self.costs = (
            cfg, world, cluster, probe, costs)
        self.disk = Disk()
        self.spans: list[StepSpan] = []
        self.current: SimGroup | None = None
        self.deliveries = 0  # bumped when the world hands the controller an event
        self.groups = 0
        cluster.listeners.append(self._on_lost)

    def __call__(self, spec: GroupSpec) -> SimGroup:
        self.probe.enter("make_group")
        try:
            self.groups += 1
            self.current = SimGroup(self, spec)
            return self.current
        finally:
            self.probe.leave()

    def delivered(self, kind: str) -> None:
        self.deliveries += 1
        self.probe.delivered(kind)

    def _on_lost(self, nodes: frozenset[str], kind: FailureKind) -> None:
        now = self.world.t
        self.disk.lost(nodes, now)
        g = self.current
        if g is not None and not g.closed:
            g.hosts_died(nodes, kind, now)


class SimGroup:
    def __init__(self, fleet: SimFleet, spec: GroupSpec) -> None:
        self.fleet, self.spec, self.world = fleet, spec, fleet.world
        plan = spec.plan
        self.incarnation = spec.incarnation
        self.nodes = {h.node_id: h.index for h in plan.hosts}
        self.node_set = frozenset(self.nodes)
        self.n_hosts, self.n_slices = plan.num_processes, plan.num_slices
        self.st = models.step_s(fleet.cfg, self.n_slices, spec.accum_steps)
        self.blocking = models.save_blocking_s(fleet.cfg, self.n_hosts)
        self.commit = models.save_commit_s(fleet.cfg, self.n_hosts)
        self.closed = False
        self.step = 0
        self.dead_at: float | None = None
        self.fail_at: float | None = None
        self.lost_hosts: set[int] = set()
        self.lost_nodes: set[str] = set()
        self.lost_kind = FailureKind.NODE_DIED
        self.chunk = 0
        self.in_chunk = False
        self._pending = tuple(range(self.n_hosts))
        gone = fleet.cluster.unreachable(self.node_set)
        if gone:  # a host vanished between planning and now: the actor cannot start
            self.hosts_died(frozenset(gone), FailureKind.NODE_DIED, self.world.t)

    # ---- failures -------------------------------------------------------------------------

    def hosts_died(self, nodes: frozenset[str], kind: FailureKind, at: float) -> None:
        hit = [self.nodes[n] for n in nodes if n in self.nodes]
        if not hit:
            return
        if self.dead_at is None:
            self.dead_at, self.fail_at = at, at + self.fleet.cfg.reform.detect_s
            self.lost_kind = kind
        self.lost_hosts.update(hit)
        self.lost_nodes.update(n for n in nodes if n in self.nodes)

    def _status(self) -> HostsLost:
        hosts = tuple(sorted(self.lost_hosts))
        self.fleet.delivered(self.lost_kind.value)
        reached = self._conclude(self.dead_at) if self.in_chunk else None
        return HostsLost(hosts=hosts, kind=self.lost_kind, nodes_gone=frozenset(self.lost_nodes),
                         message=f"{len(hosts)} host(s) lost ({self.lost_kind.value}): "
                                 f"{sorted(self.lost_nodes)[:4]}", step_reached=reached)

    def _failed(self) -> bool:
        return self.fail_at is not None and self.world.t >= self.fail_at - _EPS

    def _busy(self, seconds: float) -> None:
        """Spend ``seconds`` of world time in a phase; a host death raises GroupFailed."""
        end = self.world.t + seconds
        while True:
            if self._failed():
                raise GroupFailed(self._status())
            if self.world.t >= end - _EPS:
                return
            self.world.advance_to(min(end, self.fail_at or float("inf"), self.world.next_time()))

    def _call(self, fn, *args):
        self.fleet.probe.enter(fn.__name__.lstrip("_"))
        try:
            return fn(*args)
        finally:
            self.fleet.probe.leave()

    # ---- phases ---------------------------------------------------------------------------

    def form(self) -> Formed:
        return self._call(self._form)

    def _form(self) -> Formed:
        self._busy(self.fleet.costs.forming())
        return Formed(hosts=self.n_hosts)

    def restore(self, *, skip_steps: Collection[int] = ()) -> Restored:
        return self._call(self._restore, skip_steps)

    def _restore(self, skip_steps: Collection[int]) -> Restored:
        step = self.fleet.disk.newest(self.world.t, skip_steps)
        cost = self.fleet.costs.restoring(self.n_hosts, fresh=step is None)
        self._busy(cost)
        self.step = step or 0
        return Restored(restored_step=step, step=self.step, restore_s=cost)

    def compile(self) -> Compiled:
        return self._call(self._compile)

    def _compile(self) -> Compiled:
        cost = self.fleet.costs.compiling(self.n_slices)
        self._busy(cost)
        return Compiled(compile_s=cost, flops=None)

    def save(self) -> Saved:
        return self._call(self._save)

    def _save(self) -> Saved:
        disk, t0 = self.fleet.disk, self.world.t
        inflight = [s.commit_at for s in disk.pending if s.step == self.step]
        done = any(s == self.step for s, _ in disk.committed)
        wait = 0.0 if done else (max(inflight) - t0 if inflight
                                  else models.drain_save_s(self.fleet.cfg, self.n_hosts))
        self._busy(max(0.0, wait))
        disk.settle(self.world.t)
        disk.commit(self.step, self.world.t)
        return Saved(step=self.step, committed_step=self.step, save_s=self.world.t - t0)

    # ---- chunks ---------------------------------------------------------------------------

    def start_chunk(self, until_step: int, *, chunk: int, save_steps: Sequence[int],
                    copy_every: int | None = None) -> None:
        self._call(self._start_chunk, until_step, chunk, save_steps)

    def _start_chunk(self, until_step: int, chunk: int, save_steps: Sequence[int]) -> None:
        self.chunk, self.until, self.stop_at = chunk, until_step, until_step
        self.t0, self.s0 = self.world.t, self.step
        self.saves = sorted(s for s in save_steps if self.s0 < s <= until_step)
        self.in_chunk = True

    def _end_of(self, k: int) -> float:
        """When step ``k`` of this chunk finishes (blocking saves before it included)."""
        before = sum(1 for s in self.saves if s < k)
        return self.t0 + (k - self.s0) * self.st + before * self.blocking

    def _done_by(self, t: float) -> int:
        """Steps finished by time ``t``."""
        k = self.s0 + int(max(0.0, t - self.t0) / self.st + _EPS)
        k = min(k, self.stop_at)
        while k > self.s0 and self._end_of(k) > t + _EPS:
            k -= 1
        return k

    def _finish_time(self) -> float:
        end = self._end_of(self.stop_at)
        return end + (self.blocking if self.stop_at in self.saves else 0.0)

    def poll(self, timeout_s: float):
        return self._call(self._poll, timeout_s)

    def _poll(self, timeout_s: float):
        deadline = self.world.t + max(0.0, timeout_s)
        seen = self.fleet.deliveries
        while True:
            if self._failed():
                return self._status()
            if not self.in_chunk:
                return Running(pending=())
            finish = self._finish_time()
            if self.world.t >= finish - _EPS:
                step = self._conclude(finish)
                return Progress(step=step, committed_step=self.fleet.disk.newest(self.world.t),
                                records=self._records, stopped_early=step < self.until)
            if self.fleet.deliveries != seen or self.world.t >= deadline - _EPS:
                return Running(pending=self._pending)
            self.world.advance_to(min(deadline, finish, self.fail_at or float("inf"),
                                      self.world.next_time()))

    def _conclude(self, at: float) -> int:
        """End the chunk at time ``at``: steps done, saves started, span and records."""
        done = self._done_by(at)
        self.in_chunk = False
        n = done - self.s0
        started = [s for s in self.saves if s <= done and self._end_of(s) + self.blocking <= at
                   + _EPS]
        disk, last = self.fleet.disk, self.fleet.disk.pending[-1:] or []
        prev = last[0].commit_at if last else 0.0
        for s in started:
            commit_at = max(prev, self._end_of(s) + self.blocking + self.commit)
            disk.pending.append(Save(step=s, commit_at=commit_at, nodes=self.node_set))
            prev = commit_at
        if self.dead_at is not None:
            disk.lost(frozenset(self.lost_nodes), self.dead_at)
        if n > 0:
            self.fleet.spans.append(StepSpan(
                step=self.s0 + 1, incarnation=self.incarnation, wall_time=self._end_of(done),
                step_time_s=n * self.st, checkpoint_blocking_s=len(started) * self.blocking,
                count=n))
        steps = sorted({*range(max(self.s0 + 1, done - RECORDS_PER_CHUNK + 1), done + 1),
                        *started})
        self._records = tuple(self._record(k, k in started) for k in steps)
        self.step = done
        return done

    def _record(self, k: int, saved: bool) -> dict:
        return {"step": k, "loss": 1.0 / (1.0 + k) ** 0.5, "grad_norm": 1.0,
                "step_time_s": self.st, "lr": 1e-3, "saved": saved,
                "checkpoint_blocking_s": self.blocking if saved else 0.0,
                "wall_time": self._end_of(k)}

    def request_stop(self, chunk: int) -> None:
        self._call(self._request_stop, chunk)

    def _request_stop(self, chunk: int) -> None:
        if chunk == self.chunk and self.in_chunk:
            self.stop_at = min(self.until, self._done_by(self.world.t) + STOP_MARGIN_STEPS)

    # ---- the rest of the seam -------------------------------------------------------------

    def notices(self) -> list[dict]:
        return []  # the world publishes notices through the intake

    def measure_peak_flops(self) -> float:
        return 0.0

    def stacks(self) -> dict[int, str]:
        return {}

    def name_hung(self, status: Hung) -> Hung:
        return status

    def shutdown(self, *, graceful: bool, keep_processes: bool = False,
                 doomed: Collection[str] = ()) -> None:
        self._call(self._shutdown, graceful)

    def _shutdown(self, graceful: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if not graceful:  # killed actors finish no background save
            self.fleet.disk.lost(self.node_set, self.world.t)
        if self.fleet.current is self:
            self.fleet.current = None
