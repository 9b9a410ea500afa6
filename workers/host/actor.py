"""The host actor: one per TPU host, pinned to its Ray node, owning that host's JAX process.

A shell over components, each owning what it creates: ``JaxRuntime`` (the distributed group
this process is in, ``warm``), ``StepLoop`` (chunks of steps, ``steps``) with ``Position``
(``where``), ``RamTier`` (``ram``), ``CompileAhead`` (``ahead``), ``Notices`` (the metadata
watcher, ``notices``) and ``Chaos`` (injected faults). The actor holds the host's identity
(``spec``, ``host``) and its trainer, and hands each component only what it needs.

JAX is imported only after ``__init__`` has set the device environment (XLA_FLAGS, platform,
MEGASCALE_*), because XLA reads it once at backend start. The actor is threaded
(``max_concurrency`` >= 4) so that ``request_stop``, ``current_step``, diagnostics and event
polling answer while a chunk of steps runs. The driver decides the save steps and chunk
bounds, the host reports what committed.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.shared import layout as ckpt_layout
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.host_env import free_port
from orchestrator.shared.hostspec import HostSpec
from workers.host.ahead import AHEAD_JOIN_S, CompileAhead
from workers.host.chaos import Chaos
from workers.host.notices import Notices
from workers.host.ram import RamTier
from workers.host.steps import StepLoop
from workers.host.warm import JaxRuntime, apply_env, free_device_objects, warm_imports
from workers.host.where import Position, stacks

if TYPE_CHECKING:
    from orchestrator.shared.hosts import HostRef
    from workers.training.trainer import Trainer

log = logging.getLogger(__name__)


class HostActor:
    """One host's share of the run. Methods are the driver's only handle on JAX.

    Constructed as ``HostActor(spec, env)``: the spec is everything this host needs.
    """

    def __init__(self, spec: HostSpec | None, env: dict[str, str], *,
                 before_commit: Callable[[], None] | None = None) -> None:
        """``spec`` None makes a standby: a process with nothing to do until ``rejoin`` gives
        it a host (``warm`` imports JAX meanwhile). ``before_commit``: in-process tests only
        (see ``CheckpointStore``)."""
        apply_env(env)  # the node's env may name another mesh's MEGASCALE_* too
        self._before_commit = before_commit
        if spec is not None and not isinstance(spec, HostSpec):
            raise TypeError(f"HostActor needs a HostSpec, got {type(spec).__name__}: build one "
                            "with HostSpec.for_host(cfg, plan, host, checkpoint_dir=...)")
        self.spec: HostSpec | None = spec
        self.host: HostRef | None = spec.host if spec is not None else None
        self.trainer: Trainer | None = None
        """Built by ``build``, dropped by ``quiesce``; ``_need_trainer`` for the calls that
        need one."""
        self._runtime = JaxRuntime()
        self._chaos = Chaos()
        self._position = Position()
        self._ram = RamTier(trainer=self._need_trainer)
        self._steps = StepLoop(self._position, chaos=self._chaos, copies=self._ram)
        self._ahead = CompileAhead()
        self._notices = Notices()
        self._preformed = False  # ``preform`` loaded and ran the step: ``compile`` has it

    def _need_trainer(self, what: str) -> Trainer:
        if self.trainer is None:
            raise RuntimeError(f"{what} needs the step built: call build() first")
        return self.trainer

    # ---- identity and wiring ------------------------------------------------------------

    def info(self) -> dict:
        return {"pid": os.getpid(), "ip": self.host.node_ip if self.host else None,
                "index": self.host.index if self.host else None,
                "hostname": socket.gethostname()}

    def joining(self) -> bool:  # reached JAX's init (answers while it blocks)
        return self._runtime.joining

    def coordinator_address(self, ip: str | None = None) -> str:  # ip: a standby's next host
        return f"{ip or self.host.node_ip}:{free_port()}"

    def initialize(self, coordinator: str, num_processes: int, process_id: int) -> dict:
        """Join the JAX group (``JaxRuntime.join``); a ``hang_init`` fault strikes first."""
        self._runtime.prepare()
        self._chaos.at_init()
        spec = self.spec
        return self._runtime.join(coordinator, num_processes, process_id,
                                  survive_peers=spec.survive_peers,
                                  init_timeout_s=spec.init_timeout_s, heartbeat_s=spec.heartbeat_s)

    # ---- building the step --------------------------------------------------------------

    def build(self) -> dict:
        """Build mesh, model and step from the spec."""
        from workers.training.trainer import Trainer

        t0 = time.perf_counter()
        self.trainer = Trainer(self.spec, before_commit=self._before_commit)
        return {"build_s": time.perf_counter() - t0, "n_params": self.trainer.n_params}

    def checkpoint_steps(self) -> list[int]:
        """Committed checkpoint steps on disk, ascending (never one still being written)."""
        return ckpt_layout.committed_steps(self.spec.checkpoint_dir)

    def restore(self, skip_steps: list[int] | tuple[int, ...] = ()) -> dict:
        """Restore the newest committed step not in ``skip_steps``, or initialise from the seed.

        A corrupt, half-written or skipped step is moved aside (``<step>.corrupt-<n>``, never
        deleted) and the previous committed step restored; ``skipped`` lists them (host 0's
        list is authoritative: process 0 decides and moves). In a group of several processes an
        unreadable array raises ``CheckpointCorrupt(step=...)``: restore again in a new group
        with that step in ``skip_steps``.
        """
        t0 = time.perf_counter()
        tr = self._need_trainer("restore")
        out = tr.restore(list(skip_steps))
        self._position.step = tr.step
        return {"restored_step": out.step, "step": self._position.step,
                "restore_s": time.perf_counter() - t0, "skipped": out.skipped,
                "data": tr.data_resumed}

    def compile(self) -> dict:
        """Load the step from RUN_DIR/executables when its key matches, else compile (and
        store) it. ``source`` says which, ``key`` is the key's short digest (None with the store
        off), ``reason`` why it was compiled; ``init`` is the same for the init function when a
        fresh start used it."""
        tr = self._need_trainer("compile")
        if self._preformed:  # loaded and run once before the switch (``preform``)
            compile_s, self._preformed = 0.0, False
            info = dataclasses.replace(tr.compile_info, source="preformed", seconds=0.0)
        else:
            compile_s, info = tr.compile(), tr.compile_info
        return {"compile_s": compile_s, "source": info.source, "key": info.key,
                "reason": info.reason, "save_s": info.save_s, "waited_s": info.waited_s,
                "flops_xla": tr.flops_xla, "flops_analytic": tr.flops_analytic,
                "tokens": tr.tokens_per_step,
                "init": tr.init_info.as_dict() if tr.init_info else None}

    def measure_peak_flops(self, size: int = 512, repeats: int = 5) -> float:
        """Measured CPU matmul FLOP/s of one local device (the honest CPU 'peak' for MFU)."""
        from workers.training.peak import matmul_flops

        return matmul_flops(size, repeats)

    # ---- running ------------------------------------------------------------------------

    def inject_fault(self, fault: dict | None) -> None:
        """Test/chaos hook, fires once. ``{"at_step": s, "kind": k}`` with k: ``kill`` (SIGKILL
        before the step after ``s``), ``hang`` (stop answering there), ``error`` (raise there),
        ``kill_in_save`` (SIGKILL right after step ``s``'s async save started), ``hang_init``
        (never join the next distributed init: a host that does not come up). ``crash`` is not
        armed but started: this process dies by SIGSEGV ``after_s`` from now, whatever it is
        doing then (a spot host crashing inside its notice window)."""
        self._chaos.inject(fault)

    def run_steps(self, until_step: int, *, chunk: int | None = None,
                  save_steps: list[int] | tuple[int, ...] = (), report: bool = False,
                  copy_every: int | None = None) -> dict:
        """Run steps up to ``until_step``, or until a stop requested for ``chunk`` is reached.

        Every host gets the same bound and save steps: the group stops at one boundary. An
        async save starts right after each step whose number is in ``save_steps`` (the driver
        decides them). With ``eval.every`` on, the task's eval runs after each step that is a
        multiple of it (host 0's record of that step carries it under ``eval``).
        ``committed_step`` is the newest step whose save Orbax reports finished
        and which is committed on disk (never one only started). Host 0 (``report``) returns
        per-step records. ``copy_every``: the RAM tier's copy interval from this chunk on (the
        driver's ``checkpoint.ram.every: auto`` choice; every host gets the same).
        """
        if copy_every is not None:
            self._ram.set_every(copy_every)
        return self._steps.run(self._need_trainer("run_steps"), until_step, chunk=chunk,
                               save_steps=save_steps, report=report)

    def request_stop(self, chunk: int, at_step: int) -> int:
        """Stop ``chunk``'s run_steps once this host's step reaches ``at_step`` (checked between
        steps, so a drain waits at most about one step). A request for an older chunk is
        ignored. Returns the current step.

        Collectives need every host to stop at the same step: pass an ``at_step`` far enough
        above every host's ``current_step()`` that none has passed it when the request lands
        (the driver uses their max + 2, ``raygroup.group.STOP_MARGIN_STEPS``: max + 1 races with a
        host finishing its step meanwhile), and compare the ``step`` each run_steps returns.
        """
        return self._steps.request_stop(chunk, at_step)

    def current_step(self) -> int:
        """The host-mirrored step (thread-safe, no device sync)."""
        return self._position.step

    def save(self, wait: bool = True) -> dict:
        """Save the current step (a no-op if it is already saved); ``wait`` until committed."""
        t0 = time.perf_counter()
        out = self.trainer.save(wait=wait)
        return {"step": out.step, "save_s": time.perf_counter() - t0,
                "committed_step": self.trainer.ckpt.committed_step()}

    def params(self) -> Any:
        return self.trainer.params_host()

    def mesh_info(self) -> dict:
        """The mesh as built here: axis sizes and, per position, the owning process (host).

        Lets the driver and tests check that the DCN axis really runs across slices.
        """
        mesh = self.trainer.mesh
        owners = [[[d.process_index for d in row] for row in plane] for plane in mesh.devices]
        return {"axes": dict(mesh.shape), "process_of_device": owners}

    # ---- the RAM tier (``RamTier``) -----------------------------------------------------

    def attach_ram(self, holders: list[tuple[str, tuple[str, int]]], *, token: str,
                   incarnation: int, every: int, keep: int, max_host_bytes: int,
                   durable_from_ram: bool = False, holder_sources: int = 2) -> None:
        """Copy this host's shards to ``holders`` ((name, wire address): own node's, peer's;
        or a peer's only) every ``every`` steps; ``durable_from_ram``: a save step's copy is
        saved durably by the first holder instead of an Orbax save from the devices here;
        ``holder_sources``: hosts whose copies a holder keeps (``max_host_bytes`` is theirs)."""
        self._ram.attach(holders, token=token, incarnation=incarnation, every=every, keep=keep,
                         max_host_bytes=max_host_bytes, holder_sources=holder_sources,
                         checkpoint_dir=self.spec.checkpoint_dir,
                         writer=self.host.node_id, source=self.host.index,
                         sources=self.spec.plan.num_processes,
                         durable_from_ram=durable_from_ram)

    def restore_from_ram(self, step: int, incarnation: int,
                         holders: dict[int, tuple[str, tuple[str, int]]], token: str) -> dict:
        """Rebuild the state of ``step`` from the RAM copies its shards need (``holders``:
        source -> (name, the holder's wire address)), into this mesh; ``token``: the run's
        secret (the holders hand copies
        only to it, and every copy is authenticated with it before use). Never raises for a
        bad or missing copy: ``ok`` False and ``reason`` tell the driver to use the durable
        tier instead (no collective ran, so the group can still restore from Orbax in
        place)."""
        return self._restored(self._ram.restore_from_ram(step, incarnation, holders, token))

    def restore_copies(self, step: int, copies: dict[str, dict], token: str, *,
                       started: float | None = None, tier: str = "ram") -> dict:
        """``restore_from_ram`` once the copies are here (label -> ``RamHolder.get``)."""
        return self._restored(self._ram.restore_copies(step, copies, token, started=started,
                                                       tier=tier))

    def restore_from_disk_copy(self, step: int, token: str) -> dict:
        """``restore_from_ram`` from the copies the holders saved durably (copy_store)."""
        where = self.spec.checkpoint_dir if self.spec is not None else None
        return self._restored(self._ram.restore_from_disk_copy(step, token, where))

    def _restored(self, out: dict) -> dict:
        if out["ok"]:
            self._position.step = out["step"]
        return out

    def ram_stats(self) -> dict | None:
        return self._ram.stats()

    def copy_now(self, persist: bool = False) -> dict:
        """Copy the current step to the holders and wait until they have it (a notice too
        short for a durable save); ``ok`` False with the reason when this host cannot.
        ``persist`` (with ``durable_from_ram``): this node's holder also saves it durably, after
        this returns."""
        return self._ram.copy_now(persist)

    # ---- compile ahead (``CompileAhead``) -----------------------------------------------

    def compile_ahead(self, spec: HostSpec) -> bool:
        """Start compiling ``spec``'s step in the background at the lowest CPU priority.
        ``spec`` is this process's host in a mesh over the first ``spec.plan.num_processes``
        processes of this runtime. False when a compile ahead is running already, ``spec``
        cannot be compiled here, no step is built or ``quiesce`` began."""
        return self._ahead.start(spec, beside_trainer=self.trainer is not None)

    def ahead_running(self) -> bool:
        return self._ahead.running()

    def wait_ahead(self, timeout_s: float = AHEAD_JOIN_S) -> list[dict]:
        """Wait for a compile ahead in flight; what every compile ahead of this process did
        (``source`` "compiled", "stored" — already — or "failed" with ``reason``). Raises if
        it is still running after ``timeout_s``."""
        return self._ahead.wait(timeout_s)

    # ---- events and diagnostics ---------------------------------------------------------

    def instance_identity(self, settings: dict) -> tuple[str, str] | None:
        """(numeric instance id, instance name) from this VM's metadata server, or None off GCE:
        the driver maps ids to names so events naming only the id reach the right host."""
        from workers.host.metadata_watcher import instance_identity

        return instance_identity(settings)

    def start_metadata_watcher(self, settings: dict, sink: Any) -> bool:
        """Start the GCE metadata watcher (if this host is on GCE or it is forced).

        ``sink`` (a driver-owned ``ray.util.queue.Queue``) receives every notice at once, so a
        notice survives this host dying before the driver's next poll.
        """
        return self._notices.start(settings, sink, self.host)

    def whereabouts(self) -> dict:
        """``{"step", "entered", "calls"}`` (``Position.whereabouts``): answered on another
        thread while a long call runs, never waiting for it."""
        return self._position.whereabouts()

    def stacks(self) -> str:
        """Python stacks of every thread (written to RUN_DIR/diagnostics on a timeout)."""
        return stacks()

    # ---- leaving: the warm process (``JaxRuntime``) and the end -------------------------

    def warm(self, task: Any = None, train: Any = None, total_steps: int | None = None,
             seed: int = 0) -> dict:
        """A standby's imports, paid before a switch needs them (``warm_imports``)."""
        return warm_imports(task, train, total_steps, seed)

    def quiesce(self, ahead_wait_s: float = AHEAD_JOIN_S) -> dict:
        """The first half of ``release``, run on every host at once: stop the metadata watcher
        and the RAM copies, finish pending saves (they may need every host) and drop the
        trainer. A compile ahead still running is waited for up to ``ahead_wait_s`` (the next
        group may load it); past that, ``release`` refuses. Idempotent."""
        t0 = time.perf_counter()
        self._ahead.leave(ahead_wait_s)  # and no compile ahead starts from now on
        self._notices.stop()
        self._ram.detach()
        self._preformed = False
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
            free_device_objects()
        return {"pid": os.getpid(), "quiesce_s": time.perf_counter() - t0}

    def release(self) -> dict:
        """Leave this group and keep the process: ``quiesce``, then shut the distributed
        runtime down and clear JAX's (and Orbax's) backends and caches, so ``rejoin`` can join
        another group. Process 0 runs the coordination service: release it last. Raises if
        the runtime cannot be shut down cleanly; the driver then kills this process and
        starts a fresh one."""
        t0 = time.perf_counter()
        # a no-op when the driver quiesced every host first (WarmPool.park waits there for a
        # compile ahead, within its bound); here a compile still running means refuse
        self.quiesce(ahead_wait_s=0.0)
        if self._ahead.running():
            raise RuntimeError("a compile ahead is still running: leaving the runtime would "
                               "clear the backend under it (the driver starts a fresh process)")
        t1 = time.perf_counter()
        left = self._runtime.leave()
        self._steps.reset()
        self._position.reset()
        self._chaos.clear()
        return {"pid": os.getpid(), "release_s": time.perf_counter() - t0, "quiesce_s": t1 - t0,
                **left}

    def rejoin(self, spec: HostSpec, env: dict[str, str]) -> dict:
        """Take ``spec``'s host in the next group (after ``release``, or as a standby): the
        same physical host, so the same devices; ``initialize`` follows."""
        if not isinstance(spec, HostSpec):
            raise TypeError(f"rejoin needs a HostSpec, got {type(spec).__name__}")
        if self.trainer is not None:
            raise RuntimeError("rejoin needs release() first: this process still has a trainer")
        if self.host is not None and spec.host.node_id != self.host.node_id:
            raise ValueError(f"this process runs on node {self.host.node_id}, not on "
                             f"{spec.host.node_id}: a process cannot change hosts")
        apply_env(env)  # a parked process still has its old mesh's MEGASCALE_* (runtime_env)
        self.spec, self.host = spec, spec.host
        self._ahead.rejoin()
        return {"pid": os.getpid()}

    def preform(self, spec: HostSpec, env: dict[str, str], coordinator: str,
                num_processes: int, process_id: int) -> dict:
        """A standby joins the group its spare slice would form, before any switch
        (``orchestrator.raygroup.preform``): runtime joined, step built, loaded and run once.
        A group that adopts it then only restores into it."""
        t0 = time.perf_counter()
        self.rejoin(spec, env)
        self.initialize(coordinator, num_processes, process_id)
        self.build()
        source = self.compile()["source"]
        first_run_s = self._need_trainer("preform").run_once()
        self._preformed = True
        return {"preform_s": time.perf_counter() - t0, "first_run_s": first_run_s,
                "source": source}

    def shutdown(self) -> None:
        """Finish pending saves so a drained host leaves complete checkpoints behind."""
        self._notices.stop()
        if self.trainer is not None:
            try:
                self.trainer.close()
            except OrchestratorError:
                raise
            except Exception as exc:  # a dying group; the driver kills us next anyway
                faulthandler.dump_traceback()
                raise RuntimeError(f"close failed: {exc}") from None
