"""The host actor: one per TPU host, pinned to its Ray node, owning that host's JAX process.

JAX is imported only after ``__init__`` has set the device environment (XLA_FLAGS, platform,
MEGASCALE_*), because XLA reads it once at backend start. The actor is threaded
(``max_concurrency`` >= 4) so that ``request_stop``, ``current_step``, diagnostics and event
polling answer while a chunk of steps runs. It is built from a ``HostSpec`` (what this host
needs); the driver decides the save steps and chunk bounds, the host reports what committed.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.shared import layout as ckpt_layout
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.host_env import HOST_INIT_SHARE, free_port
from orchestrator.shared.hostspec import HostSpec
from workers.host.ahead import AheadMethods
from workers.host.metadata_watcher import put_bounded
from workers.host.ram import RamTierMethods
from workers.host.stops import StopBoard
from workers.host.warm import RELEASE_BARRIER_S, WarmMethods, apply_env
from workers.host.where import WhereMethods

log = logging.getLogger(__name__)

_SINK_TRIES = 6  # a refused notice is retried after 0.1, 0.2, 0.4, 0.8, 1.6 s (3.1 s in all)
_SINK_CALL_TIMEOUT_S = 2.0


def _crash_later(after_s: float) -> None:
    """Chaos: SIGSEGV to this process ``after_s`` from now, as a native crash would end it
    (no cleanup, no flush); SIGKILL if a fault handler kept it alive."""
    time.sleep(after_s)
    log.warning("chaos: SIGSEGV to this host process (pid %d)", os.getpid())
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(5.0)
    os.kill(os.getpid(), signal.SIGKILL)


class HostActor(RamTierMethods, WarmMethods, AheadMethods, WhereMethods):
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
        self.spec: Any = spec
        self.host: Any = spec.host if spec is not None else None
        self.trainer: Any = None
        self._fault: dict | None = None
        self._lock = threading.Lock()
        self._ahead: threading.Thread | None = None
        self._leaving = False
        self.ahead_results: list[dict] = []
        self._watcher: Any = None
        self._sink: Any = None
        self._stops = StopBoard()
        self._step, self._in_step = 0, False
        """The host-mirrored step (and whether the next one runs), readable from any thread."""
        self._replicator: Any = None
        self._persist: dict | None = None

    # ---- identity and wiring ------------------------------------------------------------

    def info(self) -> dict:
        return {"pid": os.getpid(), "ip": self.host.node_ip if self.host else None,
                "index": self.host.index if self.host else None,
                "hostname": socket.gethostname()}

    def joining(self) -> bool:  # reached JAX's init (answers while it blocks)
        return getattr(self, "_joining", False)

    def coordinator_address(self) -> str:
        return f"{self.host.node_ip}:{free_port()}"

    def initialize(self, coordinator: str, num_processes: int, process_id: int) -> dict:
        """Join the JAX group within ``HOST_INIT_SHARE`` of ``init_timeout_s``
        (``orchestrator.raygroup.runtime``)."""
        import jax

        import workers.training.trainer  # noqa: F401  (the step's imports, before the freeze)

        # What exists now (Ray, the imports) lives as long as the process: leave it out of the
        # collections ``quiesce`` needs (0.27 s of a switch otherwise). No backend exists yet,
        # so none of its objects is frozen: ``release`` can still free them.
        gc.freeze()
        self._maybe_init_fault()
        # a peer's death then fails our collectives instead of aborting this process (the
        # default), so ``release`` can keep it for the next group
        jax.config.update("jax_enable_recoverability", bool(self.spec.survive_peers))
        self._joining = True
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
            initialization_timeout=max(1, int(HOST_INIT_SHARE * self.spec.init_timeout_s)),
            heartbeat_timeout_seconds=max(2, int(self.spec.heartbeat_s)),
            # ``release`` shuts the runtime down with a barrier: bounded, never JAX's 300 s
            shutdown_timeout_seconds=RELEASE_BARRIER_S)
        return {"process_index": jax.process_index(), "local_devices": jax.local_device_count(),
                "global_devices": jax.device_count(), "platform": jax.devices()[0].platform}

    def _need_trainer(self, what: str) -> Any:
        if self.trainer is None:
            raise RuntimeError(f"{what} needs the step built: call build() first")
        return self.trainer

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
        out = self._need_trainer("restore").restore(list(skip_steps))
        self._step = self.trainer.step
        return {"restored_step": out.step, "step": self._step,
                "restore_s": time.perf_counter() - t0, "skipped": out.skipped,
                "data": self.trainer.data_resumed}

    def compile(self) -> dict:
        """Load the step from RUN_DIR/executables when its key matches, else compile (and
        store) it. ``source`` says which, ``key`` is the key's short digest (None with the store
        off), ``reason`` why it was compiled; ``init`` is the same for the init function when a
        fresh start used it."""
        tr = self._need_trainer("compile")
        compile_s = tr.compile()
        info = tr.compile_info
        return {"compile_s": compile_s, "source": info.source, "key": info.key,
                "reason": info.reason, "save_s": info.save_s, "waited_s": info.waited_s,
                "flops_xla": tr.flops_xla, "flops_analytic": tr.flops_analytic,
                "tokens": tr.tokens_per_step,
                "init": tr.init_info.as_dict() if tr.init_info else None}

    def measure_peak_flops(self, size: int = 512, repeats: int = 5) -> float:
        """Measured CPU matmul FLOP/s of one local device (the honest CPU 'peak' for MFU)."""
        import jax
        import jax.numpy as jnp

        dev = jax.local_devices()[0]
        a = jax.device_put(jnp.ones((size, size), jnp.float32), dev)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(a).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        return 2.0 * size**3 / best

    # ---- running ------------------------------------------------------------------------

    def inject_fault(self, fault: dict | None) -> None:
        """Test/chaos hook, fires once. ``{"at_step": s, "kind": k}`` with k: ``kill`` (SIGKILL
        before the step after ``s``), ``hang`` (stop answering there), ``error`` (raise there),
        ``kill_in_save`` (SIGKILL right after step ``s``'s async save started), ``hang_init``
        (never join the next distributed init: a host that does not come up). ``crash`` is not
        armed but started: this process dies by SIGSEGV ``after_s`` from now, whatever it is
        doing then (a spot host crashing inside its notice window)."""
        if fault and fault["kind"] == "crash":
            threading.Thread(target=_crash_later, args=(float(fault.get("after_s", 1.0)),),
                             name="chaos-crash", daemon=True).start()
            return
        self._fault = fault

    def _maybe_init_fault(self) -> None:
        f = self._fault
        if f and f["kind"] == "hang_init":
            self._fault = None
            time.sleep(f.get("seconds", 3600))

    def run_steps(self, until_step: int, *, chunk: int | None = None,
                  save_steps: list[int] | tuple[int, ...] = (), report: bool = False) -> dict:
        """Run steps up to ``until_step``, or until a stop requested for ``chunk`` is reached.

        Every host gets the same bound and save steps: the group stops at one boundary. An
        async save starts right after each step whose number is in ``save_steps`` (the driver
        decides them). With ``eval.every`` on, the task's eval runs after each step that is a
        multiple of it (host 0's record of that step carries it under ``eval``).
        ``committed_step`` is the newest step whose save Orbax reports finished
        and which is committed on disk (never one only started). Host 0 (``report``) returns
        per-step records.
        """
        tr = self._need_trainer("run_steps")
        saves = set(save_steps)
        if chunk is not None:
            self._stops.begin(chunk)
        records: list[dict] = []
        blocking = 0.0
        stopped = False
        try:
            while tr.step < until_step:
                at = self._stops.stop_at(chunk) if chunk is not None else None
                if at is not None and tr.step >= at:
                    stopped = True
                    break
                self._maybe_fault(tr.step)
                self._in_step = True  # whereabouts: this host entered step tr.step + 1
                out = tr.train_step()
                self._step, self._in_step = out.step, False
                saved, saved_s, ram_s = False, 0.0, 0.0
                if out.step in saves and self._can_persist():
                    ram_s = self._replicator.after_step(out.step, tr.state,
                                                        persist=self._persist,
                                                        data=tr.data_record)
                    saved, saved_s = True, ram_s
                    blocking += saved_s
                elif out.step in saves:
                    so = tr.save()
                    saved, saved_s = so.started, so.blocking_s
                    blocking += saved_s
                    self._maybe_save_fault(out.step)
                elif self._replicator is not None:
                    ram_s = self._replicator.after_step(out.step, tr.state,
                                                        data=tr.data_record)
                wall = time.time()
                # the eval is a collective: every host runs it at the same steps (a pure
                # function of the step, never of a stop request only some have seen yet)
                every = getattr(tr, "eval_every", 0)
                ev = tr.evaluate() if every and out.step % every == 0 else None
                if report:
                    records.append({"step": out.step, "loss": out.loss,
                                    "grad_norm": out.grad_norm, "step_time_s": out.step_time_s,
                                    "lr": out.lr, "checkpoint_blocking_s": saved_s,
                                    "ram_copy_s": ram_s, "saved": saved,
                                    "saved_from_ram": saved and ram_s > 0,
                                    "metrics": out.extra, "wall_time": wall})
                    if ev is not None:
                        records[-1]["eval"] = ev.as_record(tr.task.tokens_per_example)
        finally:
            if chunk is not None:
                self._stops.end(chunk)
        return {"step": tr.step, "records": records, "committed_step": self._committed(),
                "stopped_early": stopped, "checkpoint_blocking_s": blocking}

    def request_stop(self, chunk: int, at_step: int) -> int:
        """Stop ``chunk``'s run_steps once this host's step reaches ``at_step`` (checked between
        steps, so a drain waits at most about one step). A request for an older chunk is
        ignored. Returns the current step.

        Collectives need every host to stop at the same step: pass an ``at_step`` far enough
        above every host's ``current_step()`` that none has passed it when the request lands
        (the driver uses their max + 2, ``raygroup.group.STOP_MARGIN_STEPS``: max + 1 races with a
        host finishing its step meanwhile), and compare the ``step`` each run_steps returns.
        """
        if not self._stops.request(chunk, at_step):
            log.info("stale stop request for chunk %d ignored", chunk)
        return self._step

    def current_step(self) -> int:
        """The host-mirrored step (thread-safe, no device sync)."""
        return self._step

    def _maybe_fault(self, step: int) -> None:
        f = self._fault
        if not f or f["kind"] not in ("kill", "hang", "error") or step < f["at_step"]:
            return
        self._fault = None
        if f["kind"] == "kill":
            # Deterministic injection: earlier async saves are allowed to commit first, so the
            # restore point does not depend on how fast this machine writes (``kill_in_save``
            # covers the kill that lands while a save is in flight).
            if self.trainer is not None:
                self.trainer.ckpt.wait()
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9: no cleanup, no flush
        if f["kind"] == "hang":
            time.sleep(f.get("seconds", 3600))
        if f["kind"] == "error":
            raise RuntimeError(f"injected application error at step {step}")

    def _maybe_save_fault(self, step: int) -> None:
        f = self._fault
        if f and f["kind"] == "kill_in_save" and step >= f["at_step"]:
            os.kill(os.getpid(), signal.SIGKILL)  # the async save is still being written

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
        try:
            from workers.host.metadata_watcher import start_watcher
        except ImportError:
            return False
        with self._lock:
            self._sink = sink
            if self._watcher is None:
                self._watcher = start_watcher(settings, host=self.host, sink=self._on_event)
        return self._watcher is not None

    def _on_event(self, event: dict) -> None:
        """Hand a notice to the driver's queue (on the watcher's thread). A queue that refuses
        it (full, its actor restarting) or does not answer is retried with backoff for ~3 s;
        after that the notice is logged as lost, by id, at ERROR: nothing on this host would
        ever read it."""
        delay, last = 0.1, None
        for attempt in range(_SINK_TRIES):
            try:
                put_bounded(self._sink, event, _SINK_CALL_TIMEOUT_S)
                return
            except Exception as exc:
                last = exc
                if attempt + 1 < _SINK_TRIES:
                    time.sleep(delay)
                    delay *= 2
        log.error("metadata notice %s (%s) lost: the driver's queue refused it %d times "
                  "(%s: %s)", event.get("id"), event.get("kind"), _SINK_TRIES,
                  type(last).__name__, last)

    def shutdown(self) -> None:
        """Finish pending saves so a drained host leaves complete checkpoints behind."""
        if self._watcher is not None:
            self._watcher.stop()
        if self.trainer is not None:
            try:
                self.trainer.close()
            except OrchestratorError:
                raise
            except Exception as exc:  # a dying group; the driver kills us next anyway
                faulthandler.dump_traceback()
                raise RuntimeError(f"close failed: {exc}") from None
