"""The Ray seam: creating, calling and killing the host actors of one JAX group.

Every call that waits is bounded: a timeout becomes ``BarrierTimeout``, an actor or node death
becomes ``GroupFailure`` naming the hosts. A half-built group is always torn down by
``shutdown`` (kill every actor created so far), so nothing is left running after an error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.config import RunConfig
from orchestrator.errors import BarrierTimeout, GroupFailure, OrchestratorError
from orchestrator.plan import MeshPlan
from workers.host import HostActor, device_env

log = structlog.get_logger(__name__)

_RemoteHost = ray.remote(HostActor)


class WorkerGroup:
    """One incarnation of the JAX group: ``len(plan.hosts)`` actors, one per host."""

    actor_cls: Any = _RemoteHost
    """Seam: tests may swap the actor class."""

    init_grace_s: float = 5.0
    """After a peer's init failed: how long the others get before they count as hung."""

    def __init__(self, cfg: RunConfig, plan: MeshPlan, *, run_dir: Path, incarnation: int) -> None:
        self.cfg = cfg
        self.plan = plan
        self.run_dir = run_dir
        self.incarnation = incarnation
        self.actors: list[Any] = []

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Create one actor per host, pinned to its node (hard affinity)."""
        coordinator_ip = self.plan.hosts[0].node_ip
        for h in self.plan.hosts:
            env = device_env(platform=self.plan.platform, devices_per_host=h.devices,
                             extra=self.plan.megascale_env(h, coordinator_ip=coordinator_ip))
            actor = self.actor_cls.options(
                name=None, num_cpus=0, resources={"TPU": h.devices}, max_concurrency=4,
                max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                    node_id=h.node_id, soft=False),
                runtime_env={"env_vars": env},
            ).remote(h, env)
            self.actors.append(actor)

    def initialize(self) -> list[dict]:
        """Join one JAX distributed runtime, coordinator on host 0; bounded by timeouts.init_s."""
        t = self.cfg.timeouts
        coord = self._get([self.actors[0].coordinator_address.remote()], "init", t.init_s)[0]
        refs = [a.initialize.remote(coord, len(self.actors), i, init_timeout_s=t.init_s,
                                    heartbeat_s=t.heartbeat_s)
                for i, a in enumerate(self.actors)]
        started = time.monotonic()
        try:
            return self._get(refs, "init", t.init_s + 15)
        except BarrierTimeout:
            raise
        except GroupFailure as exc:
            # A host that never joins makes its peers' initialize fail (JAX aborts them) when
            # the coordinator gives up after init_s: then the hang is the cause, not the peers'
            # deaths. A failure well before init_s is a host lost or crashed, not a hang.
            if time.monotonic() - started < 0.9 * t.init_s:
                raise
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.init_grace_s)
            stuck = tuple(i for i, r in enumerate(refs) if r not in ready)
            if stuck:
                raise BarrierTimeout("init", t.init_s, hosts=stuck) from exc
            raise

    def build_and_restore(self, accum_steps: int) -> list[dict]:
        t = self.cfg.timeouts
        ckpt = str(self.run_dir / "checkpoints")
        self._get([a.build.remote(self.cfg, self.plan, ckpt, accum_steps) for a in self.actors],
                  "restore", t.restore_s)
        return self._get([a.restore.remote() for a in self.actors], "restore", t.restore_s)

    def compile(self) -> list[dict]:
        return self._get([a.compile.remote() for a in self.actors], "compile",
                         self.cfg.timeouts.compile_s)

    def run_steps(self, until_step: int, *, checkpoint_every: int) -> list[Any]:
        """Start a chunk on every host (non-blocking); the controller waits on the refs."""
        every = checkpoint_every
        return [a.run_steps.remote(until_step, checkpoint_every=every, report=(i == 0))
                for i, a in enumerate(self.actors)]

    def save(self, *, wait: bool = True) -> list[dict]:
        return self._get([a.save.remote(wait=wait) for a in self.actors], "save",
                         self.cfg.timeouts.save_s)

    def call_all(self, method: str, *args: Any, timeout_s: float, phase: str = "step", **kw: Any
                 ) -> list[Any]:
        return self._get([getattr(a, method).remote(*args, **kw) for a in self.actors], phase,
                         timeout_s)

    def dead_hosts(self, timeout_s: float = 3.0) -> tuple[int, ...]:
        """Hosts whose actor is gone. A collective error on a survivor often arrives before the
        dead peer's ActorDiedError, so a failure is attributed by probing every actor."""
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

    def stacks(self, timeout_s: float = 5.0) -> dict[int, str]:
        """Best effort: each live actor's Python stacks (threaded actors answer mid-step)."""
        out: dict[int, str] = {}
        refs = {i: a.stacks.remote() for i, a in enumerate(self.actors)}
        for i, ref in refs.items():
            try:
                out[i] = ray.get(ref, timeout=timeout_s)
            except Exception as exc:  # dead or stuck: record why instead of stacks
                out[i] = f"<no stacks: {type(exc).__name__}: {exc}>"
        return out

    def shutdown(self, *, graceful: bool = False, timeout_s: float = 30.0) -> None:
        """Kill every actor (after letting pending saves finish when ``graceful``)."""
        if graceful and self.actors:
            try:
                self._get([a.shutdown.remote() for a in self.actors], "save", timeout_s)
            except OrchestratorError as exc:
                log.warning("graceful_shutdown_failed", error=str(exc))
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception as exc:  # already dead
                log.debug("kill_failed", error=str(exc))
        self.actors = []

    # ---- waiting ------------------------------------------------------------------------

    def hosts_of(self, refs: Sequence[Any], failed: Any) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(refs) if r == failed)

    def _get(self, refs: list[Any], phase: str, timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                stuck = tuple(i for i, r in enumerate(refs) if r in pending)
                raise BarrierTimeout(phase, timeout_s, hosts=stuck)
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                self.result_of(refs, ref)
        return ray.get(list(refs))

    def result_of(self, refs: Sequence[Any], ref: Any) -> Any:
        """``ray.get`` one finished ref, mapping Ray's failures to GroupFailure."""
        try:
            return ray.get(ref)
        except OrchestratorError:
            raise
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            hosts = self.hosts_of(refs, ref)
            raise GroupFailure(f"host(s) {list(hosts)} lost: {type(exc).__name__}",
                               hosts=hosts) from exc
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if hasattr(exc, "cause") else exc
            if isinstance(cause, OrchestratorError):
                raise cause from None
            hosts = self.hosts_of(refs, ref)
            raise GroupFailure(f"host(s) {list(hosts)} failed: {type(cause).__name__}: {cause}",
                               hosts=hosts) from exc
        except GetTimeoutError as exc:  # pragma: no cover - ray.wait guards this
            raise BarrierTimeout("step", 0.0) from exc
