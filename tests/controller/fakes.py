"""A virtual clock, cluster and worker group that speak the controller's seam protocols.

The fake group simulates hosts stepping on the virtual clock (one step per poll), async saves
that commit ``commit_after`` steps after they start, checkpoints that outlive a group (a
``Disk``), and scripted faults keyed by step, so every controller path runs in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from orchestrator.controller.seam import (
    Compiled,
    CorruptCheckpoint,
    Fatal,
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
from orchestrator.shared.hosts import HostRef
from policies.causes import FailureKind


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class FakeCluster:
    """TPU-like hosts: ``slices`` × ``hosts_per_slice``; node ids ``<slice>-h<i>``."""

    def __init__(self, slices: Sequence[str] = ("s0",), hosts_per_slice: int = 2,
                 devices: int = 2) -> None:
        self.devices = devices
        self.hosts_per_slice = hosts_per_slice
        self._hosts: list[HostRef] = []
        for s in slices:
            self.add_slice(s)

    def add_slice(self, name: str) -> None:
        for w in range(self.hosts_per_slice):
            self._hosts.append(HostRef(index=len(self._hosts), slice_name=name, worker_id=w,
                                       node_id=f"{name}-h{w}", node_ip=f"10.0.{len(self._hosts)}.1",
                                       instance=f"vm-{name}-{w}", devices=self.devices))

    def remove(self, node_id: str) -> None:
        self._hosts = [h for h in self._hosts if h.node_id != node_id]

    def hosts(self) -> list[HostRef]:
        return list(self._hosts)

    def platform(self) -> str:
        return "cpu"

    def unreachable(self, node_ids: Collection[str]) -> set[str]:
        alive = {h.node_id for h in self._hosts}
        return {n for n in node_ids if n not in alive}


@dataclass
class Disk:
    """Checkpoints that outlive groups: committed steps and the corrupt ones among them."""

    committed: list[int] = field(default_factory=list)
    corrupt: set[int] = field(default_factory=set)
    corrupt_raises: bool = False  # True: restore raises CorruptCheckpoint (no in-group fallback)


class FakeFleet:
    """Makes FakeGroups and holds what outlives them: the disk, the script, the record."""

    def __init__(self, clock: FakeClock, cluster: FakeCluster, *, step_s: float = 0.1,
                 commit_after: int = 0, save_s: float = 0.2) -> None:
        self.clock, self.cluster = clock, cluster
        self.step_s, self.commit_after, self.save_s = step_s, commit_after, save_s
        self.disk = Disk()
        self.groups: list[FakeGroup] = []
        self.at_step: dict[int, list[Callable[[FakeGroup], object]]] = {}
        self.at_phase: dict[str, list[Callable[[FakeGroup], object]]] = {}
        self.form_failures: list[GroupFailed] = []
        self.compile_error: Exception | None = None
        self.compile_failures: list[GroupFailed] = []
        self.save_failures: list[GroupFailed] = []  # raised by the next durable saves
        self.formed_instance_ids: dict[str, str] = {}
        self.copy_s = 0.05
        self.pack_s = 0.0
        """Seconds a periodic RAM copy blocks a step (in host 0's records; 0: no copies)."""
        self.ram_copies: list[int] = []  # steps copied to the RAM tier (copy_to_ram)
        self.persisted: list[int] = []  # of those, steps the holders were asked to persist
        self.warmed: list[list[str]] = []  # hosts each warm_up was asked for
        self.warm_after_polls: int | None = 3  # warm_ready after this many probes (None: no pool)
        self.standby_ready_after_polls = 0  # the same for hosts with a standby (pre-forming)
        self.ahead: list[GroupSpec] = []  # specs compile_ahead was asked for
        self.ahead_steps: list[int] = []  # the group's step when it was asked
        self.stored: set[tuple] = set()  # executable keys compiled ahead (compile loads them)
        self.group_cls: type[FakeGroup] = FakeGroup  # PlainGroup: no optional capability

    def on_phase(self, phase: str, fn: Callable[[FakeGroup], object]) -> None:
        """Run ``fn(group)`` inside a group's ``form`` or ``restore`` (before it returns)."""
        self.at_phase.setdefault(phase, []).append(fn)

    def on_step(self, step: int, fn: Callable[[FakeGroup], object]) -> None:
        """Run ``fn(group)`` when a group reaches ``step``; a returned failure status ends the
        chunk with it (a fault), a returned None lets it go on."""
        self.at_step.setdefault(step, []).append(fn)

    def __call__(self, spec: GroupSpec) -> FakeGroup:
        g = self.group_cls(self, spec)
        self.groups.append(g)
        return g


def executable_key(spec: GroupSpec) -> tuple:
    """What the real key holds of a group spec (``workers.training.executables``): mesh shape,
    process count, model/train config and accumulation, not which hosts or slices."""
    plan = spec.plan
    return (plan.shape, plan.num_processes, plan.num_slices, spec.cfg.model, spec.cfg.train,
            spec.cfg.run.total_steps, spec.accum_steps)


class FakeGroup:
    def __init__(self, fleet: FakeFleet, spec: GroupSpec) -> None:
        self.fleet, self.spec = fleet, spec
        self.step = 0
        self.pending_saves: list[tuple[int, int]] = []  # (step, commit at host step)
        self.chunks: list[dict] = []
        self.until = 0
        self.chunk = 0
        self.stop_at: int | None = None
        self.records: list[dict] = []
        self.queue: list[dict] = []
        self.injected: list[tuple[int, dict]] = list(spec.init_faults)
        self.shutdowns: list[bool] = []
        self.kept_processes: list[bool] = []
        self.doomed_at_shutdown: list[frozenset[str]] = []
        self._warm_polls = 0
        self.hang = False

    # -- phases --
    def _phase(self, name: str) -> None:
        for fn in self.fleet.at_phase.get(name, ()):
            fn(self)

    def form(self) -> Formed:
        self._phase("form")
        if self.fleet.form_failures:
            raise self.fleet.form_failures.pop(0)
        return Formed(hosts=len(self.spec.plan.hosts),
                      instance_ids=dict(self.fleet.formed_instance_ids),
                      processes={"fresh": len(self.spec.plan.hosts), "parked": 0, "standby": 0})

    def restore(self, *, skip_steps: Collection[int] = ()) -> Restored:
        self._phase("restore")
        disk = self.fleet.disk
        ram = max(self.fleet.ram_copies, default=None)
        if ram is not None and ram >= max(disk.committed, default=-1):
            self.step = ram
            return Restored(restored_step=ram, step=ram, restore_s=0.01, tier="ram")
        skipped = []
        for s in sorted(disk.committed, reverse=True):
            if s in skip_steps:
                continue
            if s in disk.corrupt:
                if disk.corrupt_raises:
                    raise GroupFailed(CorruptCheckpoint(step=s, reason="array file truncated"))
                skipped.append({"step": s, "reason": "array file truncated"})
                continue
            self.step = s
            return Restored(restored_step=s, step=s, restore_s=0.1, skipped=tuple(skipped))
        return Restored(restored_step=None, step=0, restore_s=0.0, skipped=tuple(skipped))

    def compile(self) -> Compiled:
        if self.fleet.compile_error is not None:
            raise self.fleet.compile_error
        if self.fleet.compile_failures:
            raise self.fleet.compile_failures.pop(0)
        if executable_key(self.spec) in self.fleet.stored:
            return Compiled(compile_s=0.1, flops=1e6, source="loaded", key="ahead")
        return Compiled(compile_s=1.0, flops=1e6)

    def compile_ahead(self, spec: GroupSpec) -> bool:
        self.fleet.ahead.append(spec)
        self.fleet.ahead_steps.append(self.step)
        self.fleet.stored.add(executable_key(spec))
        return True

    def start_chunk(self, until_step: int, *, chunk: int, save_steps: Sequence[int],
                    copy_every: int | None = None) -> None:
        self.until, self.chunk, self.stop_at, self.records = until_step, chunk, None, []
        self.chunks.append({"from": self.step, "until": until_step, "save_steps": list(save_steps),
                            "copy_every": copy_every})
        self.save_steps = set(save_steps)

    def poll(self, timeout_s: float):
        if self.hang:
            self.fleet.clock.sleep(timeout_s)
            return Running(pending=(0,))
        limit = self.until if self.stop_at is None else min(self.until, self.stop_at)
        if self.step >= limit:
            return Progress(step=self.step, committed_step=self._committed(),
                            records=tuple(self.records), stopped_early=self.step < self.until)
        self.fleet.clock.sleep(self.fleet.step_s)
        self.step += 1
        self.records.append({"step": self.step, "loss": 1.0 / self.step, "grad_norm": 1.0,
                             "step_time_s": self.fleet.step_s, "lr": 1e-3, "saved": False,
                             "checkpoint_blocking_s": 0.0, "wall_time": self.fleet.clock.now()})
        every = self.chunks[-1].get("copy_every") or 1
        if self.fleet.pack_s and self.step % every == 0:
            self.records[-1]["ram_copy_s"] = self.fleet.pack_s
        if self.step in self.save_steps:
            self.pending_saves.append((self.step, self.step + self.fleet.commit_after))
            self.records[-1]["saved"] = True
        self._commit_due()
        for fn in self.fleet.at_step.pop(self.step, []):
            out = fn(self)
            if isinstance(out, (HostsLost, Hung, Fatal)):
                self.pending_saves.clear()  # a dead group commits nothing more
                if isinstance(out, HostsLost) and out.step_reached is None:
                    out = replace(out, step_reached=self.step)
                return out
        return Running(pending=tuple(range(len(self.spec.plan.hosts))))

    def _commit_due(self) -> None:
        for s, at in list(self.pending_saves):
            if self.step >= at:
                self.fleet.disk.committed.append(s)
                self.pending_saves.remove((s, at))

    def _committed(self) -> int | None:
        return max(self.fleet.disk.committed, default=None)

    def request_stop(self, chunk: int) -> None:
        if chunk == self.chunk:
            self.stop_at = self.step + 1

    def save(self) -> Saved:
        self.fleet.clock.sleep(self.fleet.save_s)
        if self.fleet.save_failures:
            raise self.fleet.save_failures.pop(0)
        for s, _ in self.pending_saves:
            self.fleet.disk.committed.append(s)
        self.pending_saves.clear()
        if self.step not in self.fleet.disk.committed:
            self.fleet.disk.committed.append(self.step)
        return Saved(step=self.step, committed_step=self.step, save_s=self.fleet.save_s)

    def warm_up(self, hosts) -> bool:
        self.fleet.warmed.append([h.instance for h in hosts])
        self._warm_polls = 0
        standby = {h.node_id for h in self.spec.standby}
        self._warm_need = (self.fleet.standby_ready_after_polls
                           if all(h.node_id in standby for h in hosts)
                           else self.fleet.warm_after_polls)
        return self.fleet.warm_after_polls is not None

    def warm_ready(self) -> bool:
        self._warm_polls += 1
        return (self.fleet.warm_after_polls is not None
                and self._warm_polls >= (self._warm_need or 0))

    def copy_to_ram(self, *, persist: bool = False) -> Saved:
        self.fleet.clock.sleep(self.fleet.copy_s)
        self.fleet.ram_copies.append(self.step)
        self.fleet.persisted.extend([self.step] if persist else [])
        return Saved(step=self.step, committed_step=None, save_s=self.fleet.copy_s)

    def notices(self) -> list[dict]:
        out, self.queue = self.queue, []
        return out

    def inject(self, host: int, fault: dict) -> None:
        self.injected.append((host, fault))

    def measure_peak_flops(self) -> float:
        return 1e9

    def stacks(self) -> dict[int, str]:
        return {i: "stack" for i in range(len(self.spec.plan.hosts))}

    def name_hung(self, status: Hung) -> Hung:
        return status

    def shutdown(self, *, graceful: bool, keep_processes: bool = False,
                 doomed: Collection[str] = ()) -> None:
        self.shutdowns.append(graceful)
        self.kept_processes.append(keep_processes)
        self.doomed_at_shutdown.append(frozenset(doomed))


class PlainGroup(FakeGroup):
    """The core seam only, like the simulator's group: every optional capability blocked
    (``None`` is how a runtime-checkable protocol is told a method is absent)."""

    warm_up = warm_ready = copy_to_ram = compile_ahead = inject = None  # type: ignore[assignment]


def lost(hosts: tuple[int, ...] = (1,), kind: FailureKind = FailureKind.ACTOR_DIED,
         nodes: frozenset[str] = frozenset()) -> HostsLost:
    return HostsLost(hosts=hosts, kind=kind, message=f"host(s) {list(hosts)} {kind.value}",
                     nodes_gone=nodes)
