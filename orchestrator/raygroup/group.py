"""The Ray side of the controller's seam: host actors, bounded calls, typed results.

Every Ray exception is mapped here, once, into the closed set of ``seam`` statuses
(``HostsLost`` with a ``FailureKind``, ``Hung``, ``CorruptCheckpoint``); the controller never
sees a Ray type. A half-built group is always torn down by ``shutdown``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import ray
import structlog
from ray.exceptions import RayTaskError

from orchestrator.controller.seam import (
    Compiled,
    CorruptCheckpoint,
    Failure,
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
from orchestrator.raygroup import hangs as ray_hangs
from orchestrator.raygroup import preform, release
from orchestrator.raygroup import results as ray_results
from orchestrator.raygroup.cluster_view import dead_hosts, spawn
from orchestrator.raygroup.ram_holders import RamTier
from orchestrator.raygroup.results import combine, compiled, failure_kind, lost_kind, restored
from orchestrator.raygroup.runtime import join_group
from orchestrator.raygroup.warm_pool import WarmPool
from orchestrator.shared.errors import CheckpointCorrupt, OrchestratorError
from orchestrator.shared.host_env import device_env, store_dir
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import MeshPlan
from policies.causes import FailureKind
from workers.host.actor import HostActor

log = structlog.get_logger(__name__)

_RemoteHost = ray.remote(HostActor)
STOP_MARGIN_STEPS = 2


def host_envs(plan: MeshPlan) -> list[dict[str, str]]:
    """Each host's process env for ``plan``, in host order: device count, platform and the
    plan's own MEGASCALE_* (none for one slice). Fresh and reused processes alike get it, and
    apply it so that no multislice key of an older mesh survives
    (``workers.host.warm.apply_env``)."""
    coordinator_ip = plan.hosts[0].node_ip
    return [device_env(platform=plan.platform, devices_per_host=h.devices,
                       extra=plan.megascale_env(h, coordinator_ip=coordinator_ip))
            for h in plan.hosts]


class RayWorkerGroup:
    """One incarnation of the JAX group: one host actor per mesh host, pinned to its node."""

    actor_cls: Any = _RemoteHost
    init_grace_s: float = 5.0

    def __init__(self, spec: GroupSpec, *, metadata_settings: dict | None = None,
                 notice_queue: Any = None,
                 unreachable: Callable[[Collection[str]], set[str]] | None = None,
                 ram: RamTier | None = None, pool: WarmPool | None = None,
                 reuse: bool = False) -> None:
        """``pool``: warm processes shared by the run's groups (standbys; with ``reuse``, ours)."""
        self.spec = spec
        self.ram = ram
        self.pool = pool
        self.reuse = reuse and pool is not None
        self.origins: list[str] = []
        self.preformed = False  # its processes were pre-formed (``raygroup.preform``)
        self._preform_asked = False
        self._chunks = 0  # chunks started (a re-form starts its standbys after its first)
        self._warming: list[str] = []
        self._standby_due = False  # after the MFU peak or at the first chunk (or save): their
        # imports slowed restore, compile and the peak measured after it (bench/RESULTS.md)
        self.timeouts = spec.cfg.timeouts
        self.metadata_settings = metadata_settings
        self.queue = notice_queue
        self.unreachable = unreachable
        self.actors: list[Any] = []
        self._refs: list[Any] = []
        self._chunk_t0 = time.monotonic()  # when the running chunk started (a hang's age)
        self._results: dict[int, dict] = {}

    # ---- phases ---------------------------------------------------------------------------

    def form(self) -> Formed:
        t0, at = time.perf_counter(), {}  # seconds since the form began, at the end of each stage
        self._start()
        for host, fault in self.spec.init_faults:
            self._wait([self.actors[host].inject_fault.remote(fault)], "init", 30.0)
        at["actors"] = round(time.perf_counter() - t0, 3)
        if not self.preformed:  # a pre-formed group joined its runtime and built its step
            self._initialize()
            at["init"] = round(time.perf_counter() - t0, 3)
            self._wait([a.build.remote() for a in self.actors], "restore",
                       self.timeouts.restore_s)
            at["build"] = round(time.perf_counter() - t0, 3)
        if self.ram is not None:
            self._wait(self.ram.attach_calls(self.actors, self.spec.plan,
                                            incarnation=self.spec.incarnation,
                                            spare=self.spec.standby), "init", 60.0)
            at["ram_attach"] = round(time.perf_counter() - t0, 3)
        watching, ids = 0, {}
        if self.metadata_settings is not None:
            out = self._wait([a.start_metadata_watcher.remote(self.metadata_settings, self.queue)
                             for a in self.actors], "init", 30.0)
            watching = sum(bool(w) for w in out)
            # each host's own (id, name): events that name only the numeric id reach it
            found = self._wait([a.instance_identity.remote(self.metadata_settings)
                               for a in self.actors], "init", 30.0)
            ids = {str(i): str(n) for i, n in (f for f in found if f)}
        at["watchers"] = round(time.perf_counter() - t0, 3)
        processes = {k: self.origins.count(k) for k in ("fresh", "parked", "standby")}
        if self.preformed:
            processes["preformed"] = len(self.actors)
        log.info("form_timing", **at)
        return Formed(hosts=len(self.spec.plan.hosts), metadata_watchers=watching,
                      instance_ids=ids, processes=processes)

    def restore(self, *, skip_steps: Collection[int] = ()) -> Restored:
        """From the RAM tier when it holds a complete set at least as new as the newest durable
        step (``policies.ram_tier``), else from Orbax; a refused RAM copy falls back to Orbax
        in place (the RAM restore runs no collective)."""
        note = ""
        if self.ram is not None:
            choice = self.ram.pick(f"{self.spec.run_dir}/checkpoints", skip_steps)
            note = choice.reason
            if choice.tier in ("ram", "copy"):
                refs = self.ram.restore_calls(self.actors, choice)
                got = (self.ram.restored(self._wait(refs, "restore", self.timeouts.restore_s),
                                         choice) if refs else
                       f"RAM step {choice.step}: a holder vanished before the restore")
                if isinstance(got, Restored):
                    return got
                note = got
        outs = self._wait([a.restore.remote(sorted(skip_steps)) for a in self.actors], "restore",
                         self.timeouts.restore_s)
        return restored(outs, note)

    def compile(self) -> Compiled:
        out = compiled(self._wait([a.compile.remote() for a in self.actors], "compile",
                                 self.timeouts.compile_s))
        self._standby_due = True
        return out

    def compile_ahead(self, spec: GroupSpec) -> bool:
        """Fire and forget (hosts log it; ``wait_ahead`` tells tests). CPU emulation only: there
        the smaller mesh's device ids are a prefix of this one's."""
        n = spec.plan.num_processes
        if {spec.plan.platform, self.spec.plan.platform} != {"cpu"} or not 0 < n < len(self.actors):
            return False
        # with compile.share process 0 compiles for the group; the others would only look
        m = 1 if spec.cfg.compile.share else n
        for actor, hs in zip(self.actors[:m], self._host_specs(spec), strict=False):
            actor.compile_ahead.remote(hs)
        return True

    def start_chunk(self, until_step: int, *, chunk: int, save_steps: Sequence[int],
                    copy_every: int | None = None) -> None:
        self._chunks += 1
        if self.spec.incarnation <= 1 or self._chunks > 1:
            # a re-form's first chunk ends its recovery: the standbys' imports and pre-form
            # wait for it (on one machine they share its cores: a 1 GiB state's first step
            # took 10 s beside them instead of 3.3 s)
            self._standby_now()
        self._results = {}
        self._chunk_t0 = time.monotonic()
        self._refs = [a.run_steps.remote(until_step, chunk=chunk, save_steps=list(save_steps),
                                         report=(i == 0), copy_every=copy_every)
                      for i, a in enumerate(self.actors)]

    def poll(self, timeout_s: float):
        refs = self._refs
        waiting = [r for i, r in enumerate(refs) if i not in self._results]
        if waiting:
            ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=timeout_s)
            failure: Failure | None = None
            for ref in ready:
                i = refs.index(ref)
                try:
                    self._results[i] = ray.get(ref)
                except Exception as exc:
                    failure = failure or self._failure(exc, (i,))
            if failure is not None:
                failure = self._peer_hung(failure, ready)
                reached = [int(r["step"]) for r in self._results.values()]
                if isinstance(failure, HostsLost) and reached:
                    failure = HostsLost(hosts=failure.hosts, kind=failure.kind,
                                        message=failure.message, nodes_gone=failure.nodes_gone,
                                        step_reached=max(reached))
                return failure
        pending = tuple(i for i in range(len(refs)) if i not in self._results)
        if pending:
            return Running(pending=pending)
        done = combine([self._results[i] for i in range(len(refs))])
        if self.ram is not None and isinstance(done, Progress):
            self.ram.after_chunk(self.spec.incarnation, done.records)
        return done

    def _peer_hung(self, failure: Failure, ready: Sequence[Any]) -> Failure:
        """A host whose collective timed out waiting for peers still inside their step names
        those peers hung (a timeout, not the application's error): in a fresh group's first
        step Gloo gives up (30 s) before the driver's step bound does."""
        if not (isinstance(failure, HostsLost) and failure.kind is FailureKind.STEP_ERROR
                and ray_results.peer_timeout(failure.message)):
            return failure
        stuck = tuple(i for i, r in enumerate(self._refs)
                      if i not in self._results and r not in ready)
        if not stuck:
            return failure
        return self.name_hung(Hung(
            phase="step", hosts=stuck, seconds=round(time.monotonic() - self._chunk_t0, 1),
            message=f"host(s) {list(stuck)} did not answer their peers' collective: "
                    f"{failure.message}"[:2000]))

    def request_stop(self, chunk: int) -> None:
        try:
            steps = ray.get([a.current_step.remote() for a in self.actors], timeout=5.0)
            # Two past the furthest host: one past races with a host that ends its step while
            # the request is in flight (it would wait in the next step's collective for ever).
            at = max(int(s) for s in steps) + STOP_MARGIN_STEPS
            ray.get([a.request_stop.remote(chunk, at) for a in self.actors], timeout=5.0)
            log.info("stop_requested", chunk=chunk, at_step=at)
        except Exception as exc:  # a dying host: the chunk wait reports it
            log.warning("stop_request_failed", error=str(exc))

    def save(self) -> Saved:
        t0 = time.perf_counter()
        outs = self._wait([a.save.remote(wait=True) for a in self.actors], "save",
                         self.timeouts.save_s)
        self._standby_now()  # a group drained before its first chunk: after the save
        committed = [o.get("committed_step") for o in outs]
        agreed = min(committed) if all(c is not None for c in committed) else None
        return Saved(step=int(outs[0]["step"]), committed_step=agreed,
                     save_s=time.perf_counter() - t0)

    def copy_to_ram(self, *, persist: bool = False) -> Saved:
        t0 = time.perf_counter()
        outs = self._wait([a.copy_now.remote(persist) for a in self.actors], "save",
                         self.timeouts.save_s)
        self._standby_now()
        # a refusal: the restore finds no complete set in RAM and reads the durable tier
        if refused := [f"host {i}: {o['reason']}" for i, o in enumerate(outs) if not o["ok"]]:
            log.warning("ram_copy_incomplete", hosts=refused)
        return Saved(step=int(outs[0]["step"]), committed_step=None,
                     save_s=time.perf_counter() - t0, complete=not refused)

    def warm_up(self, hosts: Sequence[HostRef]) -> bool:
        self._warming = [h.node_id for h in hosts]
        self._standby_due = False  # started here with the rest (a later call would kill these)
        if self.pool is not None:
            self.pool.ensure_standby([*self.spec.standby, *hosts])
            self._preform()
        return self.pool is not None

    def warm_ready(self) -> bool:
        return self.pool is not None and self.pool.ready(self._warming)

    def notices(self) -> list[dict]:
        if self.queue is None:
            return []
        try:
            n = self.queue.qsize()
            return list(self.queue.get_nowait_batch(n)) if n else []
        except Exception as exc:
            log.warning("notice_queue_failed", error=str(exc))
            return []

    def inject(self, host: int, fault: dict) -> None:
        try:
            ray.get(self.actors[host].inject_fault.remote(fault), timeout=30)
        except Exception as exc:  # a dying actor: the next wait reports its death
            log.warning("chaos_arm_failed", error=str(exc))

    def measure_peak_flops(self) -> float:
        peak = float(ray.get(self.actors[0].measure_peak_flops.remote(), timeout=60))
        self._standby_now()  # measured on quiet cores: now the standbys may import
        return peak

    def stacks(self, timeout_s: float = 5.0) -> dict[int, str]:
        out: dict[int, str] = {}
        refs = {i: a.stacks.remote() for i, a in enumerate(self.actors)}
        for i, ref in refs.items():
            try:
                out[i] = ray.get(ref, timeout=timeout_s)
            except Exception as exc:  # dead or stuck: record why instead of stacks
                out[i] = f"<no stacks: {type(exc).__name__}: {exc}>"
        return out

    def name_hung(self, status: Hung) -> Hung:
        return ray_hangs.named(self.actors, status)

    def final_params(self) -> Any:
        """The gathered parameters (a collective: every host takes part; host 0's copy)."""
        return self._wait([a.params.remote() for a in self.actors], "save", 120.0)[0]

    def shutdown(self, *, graceful: bool, keep_processes: bool = False,
                 doomed: Collection[str] = ()) -> None:
        if self.actors and release.all_doomed(self.spec.plan.hosts, doomed):
            graceful, keep_processes = False, False
            self._refs = []
            log.info("doomed_group_killed", hosts=len(self.actors))
        # after a failure only a chunk's survivors are kept: a phase that failed (a host that
        # never joined the runtime, a hung restore) leaves processes in no known state
        if keep_processes and self.reuse and self.actors and (graceful or self._refs):
            assert self.pool is not None
            release.park(self.pool, self.spec.plan.hosts, self.actors, self._refs,
                         graceful=graceful)
            self.actors, self._refs = [], []
            return
        if graceful and self.actors:
            try:
                self._wait([a.shutdown.remote() for a in self.actors], "save",
                          self.timeouts.save_s)
            except GroupFailed as exc:
                log.warning("graceful_shutdown_failed", error=str(exc))
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception as exc:  # already dead
                log.debug("kill_failed", error=str(exc))
        self.actors, self._refs = [], []

    def _preform(self) -> None:
        """As the standbys start: pre-form those that can hold the whole mesh, once
        (``raygroup.preform``; ``controller.warm.preform``)."""
        if self._preform_asked or self.pool is None or not self.spec.cfg.controller.warm.preform:
            return
        self._preform_asked = True
        if (plan := preform.spare_plan(self.spec)) is not None:
            self.pool.start_preform(self._host_specs(dataclasses.replace(self.spec, plan=plan)),
                                    host_envs(plan))

    def _standby_now(self) -> None:
        """Start the standbys ``compile`` deferred (``__init__``), once."""
        if self._standby_due and self.pool is not None:
            self._standby_due = False
            self.pool.ensure_standby(self.spec.standby)
            self._preform()

    def _host_specs(self, spec: GroupSpec) -> list[HostSpec]:
        # the store dir is unused when compile.cache=off
        executables = store_dir(spec.cfg.compile.dir, spec.run_dir, os.environ)
        return [HostSpec.for_host(spec.cfg, spec.plan, h, checkpoint_dir=f"{spec.run_dir}/"
                                  "checkpoints", accum_steps=spec.accum_steps,
                                  executables_dir=executables, survive_peers=self.reuse)
                for h in spec.plan.hosts]

    def _start(self) -> None:
        plan = self.spec.plan
        specs = list(zip(plan.hosts, host_envs(plan), self._host_specs(self.spec), strict=True))
        fresh = functools.partial(spawn, self.actor_cls)
        adopted = None if self.pool is None else self.pool.adopt(
            [s for *_, s in specs], [e for _, e, _ in specs])
        self.preformed = adopted is not None
        got = ([(a, "standby") for a in adopted] if adopted is not None else
               self.pool.acquire(specs, fresh) if self.pool is not None else
               [(fresh(*s), "fresh") for s in specs])
        self.actors = [a for a, _ in got]
        self.origins = [origin for _, origin in got]

    def _initialize(self) -> None:
        join_group(self.actors, init_s=self.timeouts.init_s, wait=self._wait)

    def _wait(self, refs: list[Any], phase: str, timeout_s: float) -> list[Any]:
        """All results, or ``GroupFailed`` with a typed status (first failure wins)."""
        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        out: dict[int, Any] = {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                stuck = tuple(i for i, r in enumerate(refs) if r in pending)
                raise GroupFailed(self.name_hung(Hung(phase=phase, hosts=stuck,
                                                      seconds=timeout_s)))
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                i = refs.index(ref)
                try:
                    out[i] = ray.get(ref)
                except Exception as exc:
                    raise GroupFailed(self._failure(exc, (i,))) from None
        return [out[i] for i in range(len(refs))]

    def _failure(self, exc: BaseException, hosts: tuple[int, ...]) -> Failure:
        """Map one failed call to a typed status (a non-retryable error becomes ``Fatal``)."""
        cause = exc.cause if isinstance(exc, RayTaskError) and hasattr(exc, "cause") else exc
        if isinstance(cause, CheckpointCorrupt):
            return CorruptCheckpoint(step=cause.step, reason=cause.reason)
        if (full := ray_results.storage_fault(exc)) is not None:  # ENOSPC, quota: no retry
            return Fatal(message=ray_results.storage_message(full), hosts=hosts)
        if isinstance(cause, OrchestratorError) and not cause.retryable:
            return Fatal(message=str(cause), hosts=hosts)
        kind = failure_kind(exc)
        message = f"host(s) {list(hosts)}: {type(cause).__name__}: {cause}"[:2000]
        if kind is FailureKind.STEP_ERROR:
            dead = dead_hosts(self.actors)
            if dead:  # a peer died; the survivor's collective error is a consequence
                hosts, kind = dead, FailureKind.ACTOR_DIED
                message = f"host(s) {list(dead)} died ({message})"
        gone: set[str] = set()
        if kind is not FailureKind.STEP_ERROR and self.unreachable is not None:
            try:
                gone = self.unreachable([h.node_id for h in self.spec.plan.hosts])
            except Exception as err:
                log.warning("node_probe_failed", error=str(err))
        if gone:
            log.warning("nodes_gone", nodes=sorted(gone))
            kind = lost_kind(kind, gone, self.spec.plan.hosts)
        return HostsLost(hosts=hosts, kind=kind, message=message, nodes_gone=frozenset(gone))

