"""The Ray side of the controller's seam: host actors, bounded calls, typed results.

Every Ray exception is mapped here, once, into the closed set of ``seam`` statuses
(``HostsLost`` with a ``FailureKind``, ``Hung``, ``CorruptCheckpoint``); the controller never
sees a Ray type. A half-built group is always torn down by ``shutdown``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

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
    Restored,
    Running,
    Saved,
)
from orchestrator.errors import CheckpointCorrupt, OrchestratorError
from orchestrator.hosts import HostRef
from orchestrator.hostspec import HostSpec
from orchestrator.ram_tier import RamTier
from orchestrator.ray_results import combine, compiled, failure_kind, lost_kind
from orchestrator.warm_pool import WarmPool
from policies.causes import FailureKind
from workers.executables import store_dir
from workers.host import HostActor, device_env

log = structlog.get_logger(__name__)

_RemoteHost = ray.remote(HostActor)
STOP_MARGIN_STEPS = 2
REJOIN_TIMEOUT_S = 30.0
FAILED_RELEASE_S = 5.0
"""After a failure a survivor's release is short or not worth waiting for (a save stuck on a
dead peer): a fresh process costs a few seconds."""
"""A standby still importing JAX answers its rejoin after the imports (a few seconds)."""


class RayClusterView:
    """``ray.nodes()`` read as TPU hosts."""

    probe_timeout_s: float = 2.0

    def hosts(self) -> list[HostRef]:
        from orchestrator.topology import hosts_from_nodes

        return hosts_from_nodes(ray.nodes())

    def platform(self) -> str:
        from orchestrator.topology import platform_of

        return platform_of(ray.nodes())

    def unreachable(self, node_ids: Collection[str]) -> set[str]:
        """Nodes that are gone even if the GCS has not noticed yet (it marks a vanished node
        dead only after its health checks fail, ~16 s here): dead, unknown, or their raylet
        refuses a TCP connection."""
        wanted = set(node_ids)
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["NodeID"] in wanted}
        gone = wanted - set(nodes)
        for node_id, n in nodes.items():
            if not n.get("Alive") or not _accepts(n.get("NodeManagerAddress", ""),
                                                  int(n.get("NodeManagerPort", 0)),
                                                  self.probe_timeout_s):
                gone.add(node_id)
        return gone


def _wait_listening(host: str, port: int, *, timeout_s: float) -> bool:
    """Whether ``host:port`` accepts a TCP connection within ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _accepts(host, port, 0.2):
            return True
        time.sleep(0.01)
    return False


def _accepts(host: str, port: int, timeout_s: float) -> bool:
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


class RayWorkerGroup:
    """One incarnation of the JAX group: one host actor per mesh host, pinned to its node."""

    actor_cls: Any = _RemoteHost
    init_grace_s: float = 5.0

    def __init__(self, spec: GroupSpec, *, metadata_settings: dict | None = None,
                 notice_queue: Any = None,
                 unreachable: Callable[[Collection[str]], set[str]] | None = None,
                 ram: RamTier | None = None, pool: WarmPool | None = None,
                 reuse: bool = False) -> None:
        """``pool``: warm processes shared by the run's groups (standbys, and with ``reuse``
        this group's own processes parked for the next one)."""
        self.spec = spec
        self.ram = ram
        self.pool = pool
        self.reuse = reuse and pool is not None
        self.origins: list[str] = []
        self._warming: list[str] = []
        self.timeouts = spec.cfg.timeouts
        self.metadata_settings = metadata_settings
        self.queue = notice_queue
        self.unreachable = unreachable
        self.actors: list[Any] = []
        self._refs: list[Any] = []
        self._results: dict[int, dict] = {}

    # ---- phases ---------------------------------------------------------------------------

    def form(self) -> Formed:
        marks = [("start", time.perf_counter())]
        self._start()
        for host, fault in self.spec.init_faults:
            self._get([self.actors[host].inject_fault.remote(fault)], "init", 30.0)
        marks.append(("actors", time.perf_counter()))
        self._initialize()
        marks.append(("init", time.perf_counter()))
        self._get([a.build.remote() for a in self.actors], "restore", self.timeouts.restore_s)
        marks.append(("build", time.perf_counter()))
        if self.ram is not None:
            self._get(self.ram.attach_calls(self.actors, self.spec.plan,
                                            incarnation=self.spec.incarnation), "init", 60.0)
            marks.append(("ram_attach", time.perf_counter()))
        watching, ids = 0, {}
        if self.metadata_settings is not None:
            out = self._get([a.start_metadata_watcher.remote(self.metadata_settings, self.queue)
                             for a in self.actors], "init", 30.0)
            watching = sum(bool(w) for w in out)
            # each host's own (id, name): events that name only the numeric id reach it
            found = self._get([a.instance_identity.remote(self.metadata_settings)
                               for a in self.actors], "init", 30.0)
            ids = {str(i): str(n) for i, n in (f for f in found if f)}
        if self.pool is not None:
            self.pool.ensure_standby(self.spec.standby)
        marks.append(("watchers_standby", time.perf_counter()))
        processes = {k: self.origins.count(k) for k in ("fresh", "parked", "standby")}
        log.info("form_timing", **{name: round(t - prev, 3) for (name, t), (_, prev)
                                   in zip(marks[1:], marks[:-1], strict=True)})
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
                got = (self.ram.restored(self._get(refs, "restore", self.timeouts.restore_s),
                                         choice) if refs else
                       f"RAM step {choice.step}: a holder vanished before the restore")
                if isinstance(got, Restored):
                    return got
                note = got
        outs = self._get([a.restore.remote(sorted(skip_steps)) for a in self.actors], "restore",
                         self.timeouts.restore_s)
        steps = {o["restored_step"] for o in outs}
        if len(steps) != 1:
            found = sorted(steps, key=str)
            raise GroupFailed(HostsLost(hosts=tuple(range(len(outs))),
                                        kind=FailureKind.STEP_ERROR,
                                        message=f"hosts restored different steps {found}"))
        o = outs[0]
        return Restored(restored_step=o["restored_step"], step=int(o["step"]),
                        restore_s=float(o["restore_s"]), skipped=tuple(o.get("skipped", ())),
                        tier="durable", tier_reason=note)

    def compile(self) -> Compiled:
        return compiled(self._get([a.compile.remote() for a in self.actors], "compile",
                                  self.timeouts.compile_s))

    def start_chunk(self, until_step: int, *, chunk: int, save_steps: Sequence[int]) -> None:
        self._results = {}
        self._refs = [a.run_steps.remote(until_step, chunk=chunk, save_steps=list(save_steps),
                                         report=(i == 0))
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
                reached = [int(r["step"]) for r in self._results.values()]
                if isinstance(failure, HostsLost) and reached:
                    failure = HostsLost(hosts=failure.hosts, kind=failure.kind,
                                        message=failure.message, nodes_gone=failure.nodes_gone,
                                        step_reached=max(reached))
                return failure
        pending = tuple(i for i in range(len(refs)) if i not in self._results)
        if pending:
            return Running(pending=pending)
        return combine([self._results[i] for i in range(len(refs))])

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
        outs = self._get([a.save.remote(wait=True) for a in self.actors], "save",
                         self.timeouts.save_s)
        committed = [o.get("committed_step") for o in outs]
        agreed = min(committed) if all(c is not None for c in committed) else None
        return Saved(step=int(outs[0]["step"]), committed_step=agreed,
                     save_s=time.perf_counter() - t0)

    def copy_to_ram(self, *, persist: bool = False) -> Saved:
        t0 = time.perf_counter()
        outs = self._get([a.copy_now.remote(persist) for a in self.actors], "save",
                         self.timeouts.save_s)
        # a refusal: the restore finds no complete set in RAM and reads the durable tier
        if refused := [f"host {i}: {o['reason']}" for i, o in enumerate(outs) if not o["ok"]]:
            log.warning("ram_copy_incomplete", hosts=refused)
        return Saved(step=int(outs[0]["step"]), committed_step=None,
                     save_s=time.perf_counter() - t0, complete=not refused)

    def warm_up(self, hosts: Sequence[HostRef]) -> bool:
        if self.pool is None:
            return False
        self._warming = [h.node_id for h in hosts]
        self.pool.ensure_standby([*self.spec.standby, *hosts])
        return True

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
        return float(ray.get(self.actors[0].measure_peak_flops.remote(), timeout=60))

    def stacks(self, timeout_s: float = 5.0) -> dict[int, str]:
        out: dict[int, str] = {}
        refs = {i: a.stacks.remote() for i, a in enumerate(self.actors)}
        for i, ref in refs.items():
            try:
                out[i] = ray.get(ref, timeout=timeout_s)
            except Exception as exc:  # dead or stuck: record why instead of stacks
                out[i] = f"<no stacks: {type(exc).__name__}: {exc}>"
        return out

    def final_params(self) -> Any:
        """The gathered parameters (a collective: every host takes part; host 0's copy)."""
        return self._get([a.params.remote() for a in self.actors], "save", 120.0)[0]

    def shutdown(self, *, graceful: bool, keep_processes: bool = False) -> None:
        # after a failure only a chunk's survivors are kept: a phase that failed (a host that
        # never joined the runtime, a hung restore) leaves processes in no known state
        if keep_processes and self.reuse and self.actors and (graceful or self._refs):
            self._park(graceful)
            return
        if graceful and self.actors:
            try:
                self._get([a.shutdown.remote() for a in self.actors], "save",
                          self.timeouts.save_s)
            except GroupFailed as exc:
                log.warning("graceful_shutdown_failed", error=str(exc))
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception as exc:  # already dead
                log.debug("kill_failed", error=str(exc))
        self.actors = []
        self._refs = []

    # ---- internals ------------------------------------------------------------------------

    def _park(self, graceful: bool) -> None:
        """Keep the processes for the next group: quiesce them all, then release them (a
        drained group finishes its saves first). After a failure in a chunk only hosts whose
        chunk returned are released (a dead one's release fails at once; one still inside a
        step is hung) and within a short bound; every other process is killed."""
        assert self.pool is not None
        busy: set[int] = set()
        if not graceful and self._refs:
            ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0.5)
            busy = {i for i, r in enumerate(self._refs) if r not in ready}
        pairs = [(h.node_id, a) for i, (h, a) in
                 enumerate(zip(self.spec.plan.hosts, self.actors, strict=True))
                 if i not in busy]
        for i in busy:
            ray.kill(self.actors[i], no_restart=True)
        kept = self.pool.park(pairs, coordinator=self.spec.plan.hosts[0].node_id,
                              timeout_s=None if graceful else FAILED_RELEASE_S)
        log.info("processes_parked", kept=kept, of=len(self.actors), after_failure=not graceful)
        self.actors, self._refs = [], []

    def _start(self) -> None:
        plan = self.spec.plan
        coordinator_ip = plan.hosts[0].node_ip
        ckpt = f"{self.spec.run_dir}/checkpoints"
        # unused when compile.cache=off
        executables = store_dir(self.spec.cfg.compile.dir, self.spec.run_dir, os.environ)
        specs = []
        for h in plan.hosts:
            env = device_env(platform=plan.platform, devices_per_host=h.devices,
                             extra=plan.megascale_env(h, coordinator_ip=coordinator_ip))
            specs.append((h, env, HostSpec.for_host(self.spec.cfg, plan, h, checkpoint_dir=ckpt,
                                                    accum_steps=self.spec.accum_steps,
                                                    executables_dir=executables,
                                                    survive_peers=self.reuse)))
        warm = [self.pool.take(h.node_id) if self.pool is not None else None for h, _, _ in specs]
        if self.pool is not None:
            self.pool.drop_parked()  # processes on hosts this mesh left out
        rejoins = {i: w[0].rejoin.remote(spec, env)
                   for i, (w, (_, env, spec)) in enumerate(zip(warm, specs, strict=True)) if w}
        ready, _ = ray.wait(list(rejoins.values()), num_returns=len(rejoins),
                            timeout=REJOIN_TIMEOUT_S) if rejoins else ([], [])
        for i, (h, env, spec) in enumerate(specs):
            w = warm[i]
            if w is not None and self._rejoined(rejoins[i], ready, h):
                self.actors.append(w[0])
                self.origins.append(w[1])
                continue
            if w is not None:
                ray.kill(w[0], no_restart=True)  # frees the node's TPU resource for a fresh one
            self.actors.append(spawn(self.actor_cls, h, env, spec))
            self.origins.append("fresh")

    @staticmethod
    def _rejoined(ref: Any, ready: list[Any], h: HostRef) -> bool:
        try:
            if ref not in ready:
                raise TimeoutError(f"no answer within {REJOIN_TIMEOUT_S:g} s")
            ray.get(ref)
            return True
        except Exception as exc:  # a warm process is an optimisation: start a fresh one
            log.warning("rejoin_failed", host=h.index, node=h.node_id[:12],
                        error=str(exc)[:300])
            return False

    def _initialize(self) -> None:
        """Join one JAX distributed runtime, coordinator on host 0; bounded by init_s."""
        t = self.timeouts
        coord = self._get([self.actors[0].coordinator_address.remote()], "init", t.init_s)[0]
        started = time.monotonic()
        refs = [self.actors[0].initialize.remote(coord, len(self.actors), 0)]
        # A client that finds no service retries after ~1 s: ask the others once process 0's
        # coordination service listens (bounded: they would still connect, only later).
        host, port = coord.rsplit(":", 1)
        _wait_listening(host, int(port), timeout_s=min(5.0, t.init_s))
        refs += [a.initialize.remote(coord, len(self.actors), i)
                 for i, a in enumerate(self.actors) if i > 0]
        try:
            self._wait(refs, "init", t.init_s + 15)
        except GroupFailed as exc:
            # A host that never joins makes its peers' initialize fail when the coordinator
            # gives up after init_s: then the hang is the cause, not the peers' deaths.
            if isinstance(exc.status, Hung) or time.monotonic() - started < 0.9 * t.init_s:
                raise
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.init_grace_s)
            stuck = tuple(i for i, r in enumerate(refs) if r not in ready)
            if stuck:
                raise GroupFailed(Hung(phase="init", hosts=stuck, seconds=t.init_s)) from exc
            raise

    def _get(self, refs: list[Any], phase: str, timeout_s: float) -> list[Any]:
        return self._wait(refs, phase, timeout_s)

    def _wait(self, refs: list[Any], phase: str, timeout_s: float) -> list[Any]:
        """All results, or ``GroupFailed`` with a typed status (first failure wins)."""
        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        out: dict[int, Any] = {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                stuck = tuple(i for i, r in enumerate(refs) if r in pending)
                raise GroupFailed(Hung(phase=phase, hosts=stuck, seconds=timeout_s))
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
        if isinstance(cause, OrchestratorError) and not cause.retryable:
            return Fatal(message=str(cause), hosts=hosts)
        kind = failure_kind(exc)
        message = f"host(s) {list(hosts)}: {type(cause).__name__}: {cause}"[:2000]
        if kind is FailureKind.STEP_ERROR:
            dead = self._dead_hosts()
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

    def _dead_hosts(self, timeout_s: float = 3.0) -> tuple[int, ...]:
        """Hosts whose actor is gone (a collective error on a survivor often arrives before
        the dead peer's ActorDiedError)."""
        refs = [a.info.remote() for a in self.actors]
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


class RayGroups:
    """The run's group factory: groups share one driver-owned notice queue (created only when
    the hosts' metadata watchers can run), so a notice outlives the host that sent it, the
    run's RAM tier (``RamTier.for_config``; None: off) and one ``WarmPool`` (processes kept
    warm between groups, per ``controller.warm``). ``close`` when the run is over."""

    def __init__(self, cfg: Any, cluster: RayClusterView, *,
                 group_cls: type[RayWorkerGroup] | None = None,
                 ram: RamTier | None = None) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.group_cls = group_cls or RayWorkerGroup
        self.ram = ram
        self.settings = dataclasses.asdict(cfg.events.metadata)
        self.queue: Any = None
        warm = cfg.controller.warm
        self.pool: WarmPool | None = None
        if warm.reuse_processes != "off" or warm.standby_slices > 0:
            self.pool = WarmPool(start_standby=self._start_standby)

    def __call__(self, spec: GroupSpec) -> RayWorkerGroup:
        mode = self.cfg.events.metadata.enabled
        watch = mode == "on" or (mode == "auto" and spec.plan.platform == "tpu")
        if watch and self.queue is None:
            from ray.util.queue import Queue

            self.queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
        return self.group_cls(spec, metadata_settings=self.settings if watch else None,
                              notice_queue=self.queue, unreachable=self.cluster.unreachable,
                              ram=self.ram, pool=self.pool,
                              reuse=self.cfg.controller.warm.reuse(spec.plan.platform))

    def _start_standby(self, h: HostRef) -> Any:
        env = device_env(platform=self.cluster.platform(), devices_per_host=h.devices)
        if self.ram is not None:  # its holder too, so a re-form there starts no holder either
            _, holder = self.ram.holder(h.node_id)
            holder.serve.remote(self.ram.token)
        return spawn(self.group_cls.actor_cls, h, env, None)

    def close(self) -> None:
        """Kill the processes kept warm (the run is over; groups kill their own)."""
        if self.pool is not None:
            self.pool.close()


def ray_group_factory(cfg: Any, cluster: RayClusterView, *,
                      group_cls: type[RayWorkerGroup] | None = None,
                      ram: RamTier | None = None) -> RayGroups:
    """The run's ``RayGroups`` (kept as a function: callers and tests build factories so)."""
    return RayGroups(cfg, cluster, group_cls=group_cls, ram=ram)
