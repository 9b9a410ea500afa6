"""The host actor: one per TPU host, pinned to its Ray node, owning that host's JAX process.

JAX is imported only after ``__init__`` has set the device environment (XLA_FLAGS, platform,
MEGASCALE_*), because XLA reads it once at backend start. The actor is threaded
(``max_concurrency`` > 1) so that diagnostics and event polling answer while a step runs.
"""

from __future__ import annotations

import faulthandler
import io
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.errors import OrchestratorError
from orchestrator.hosts import HostRef
from orchestrator.plan import MeshPlan


def device_env(*, platform: str, devices_per_host: int, extra: dict[str, str] | None = None
               ) -> dict[str, str]:
    """Environment a host process needs before JAX starts."""
    env: dict[str, str] = {}
    if platform == "cpu":
        # Each XLA flag needs its leading "--"; an unknown flag aborts the process.
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_host}"
        env["JAX_PLATFORMS"] = "cpu"
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class HostActor:
    """One host's share of the run. Methods are the driver's only handle on JAX."""

    def __init__(self, host: HostRef, env: dict[str, str]) -> None:
        os.environ.update(env)
        self.host = host
        self.trainer: Any = None
        self._fault: dict | None = None
        self._lock = threading.Lock()
        self._watcher: Any = None
        self._pending_events: list[dict] = []

    # ---- identity and wiring ------------------------------------------------------------

    def info(self) -> dict:
        return {"pid": os.getpid(), "ip": self.host.node_ip, "index": self.host.index,
                "hostname": socket.gethostname()}

    def coordinator_address(self) -> str:
        return f"{self.host.node_ip}:{free_port()}"

    def initialize(self, coordinator: str, num_processes: int, process_id: int, *,
                   init_timeout_s: float, heartbeat_s: float) -> dict:
        """Join the JAX group; bounded by ``init_timeout_s`` (the coordinator waits that long)."""
        import jax

        self._maybe_init_fault()
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
            initialization_timeout=max(1, int(init_timeout_s)),
            heartbeat_timeout_seconds=max(2, int(heartbeat_s)))
        return {"process_index": jax.process_index(), "local_devices": jax.local_device_count(),
                "global_devices": jax.device_count(), "platform": jax.devices()[0].platform}

    # ---- building the step --------------------------------------------------------------

    def build(self, cfg: RunConfig, plan: MeshPlan, checkpoint_dir: str, accum_steps: int) -> dict:
        from workers.trainer import Trainer

        t0 = time.perf_counter()
        self.trainer = Trainer(cfg, plan, checkpoint_dir=checkpoint_dir, accum_steps=accum_steps)
        return {"build_s": time.perf_counter() - t0, "n_params": self.trainer.n_params}

    def restore(self) -> dict:
        """Restore the latest complete checkpoint, or initialise from the seed."""
        t0 = time.perf_counter()
        step = self.trainer.restore_latest()
        if step is None:
            self.trainer.init_state(self.trainer.cfg.run.seed)
        return {"restored_step": step, "step": self.trainer.step,
                "restore_s": time.perf_counter() - t0}

    def compile(self) -> dict:
        compile_s = self.trainer.compile()
        return {"compile_s": compile_s, "flops_xla": self.trainer.flops_xla,
                "flops_analytic": self.trainer.flops_analytic}

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
        (never join the next distributed init: a host that does not come up)."""
        self._fault = fault

    def _maybe_init_fault(self) -> None:
        f = self._fault
        if f and f["kind"] == "hang_init":
            self._fault = None
            time.sleep(f.get("seconds", 3600))

    def run_steps(self, until_step: int, *, checkpoint_every: int, report: bool) -> dict:
        """Run steps up to ``until_step`` (every host is given the same bound: same boundary).

        Saves asynchronously when ``step % checkpoint_every == 0``. Host 0 returns per-step
        records; others return only their final step.
        """
        tr = self.trainer
        records: list[dict] = []
        blocking = 0.0
        while tr.step < until_step:
            self._maybe_fault(tr.step)
            out = tr.train_step()
            saved_s = 0.0
            if out.step % checkpoint_every == 0:
                saved_s = tr.save()
                blocking += saved_s
                self._maybe_save_fault(out.step)
            if report:
                records.append({"step": out.step, "loss": out.loss, "grad_norm": out.grad_norm,
                                "step_time_s": out.step_time_s, "lr": out.lr,
                                "checkpoint_blocking_s": saved_s, "wall_time": time.time()})
        return {"step": tr.step, "records": records, "checkpoint_blocking_s": blocking}

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

    def save(self, *, wait: bool = True) -> dict:
        t0 = time.perf_counter()
        self.trainer.save(force=True, wait=wait)
        return {"step": self.trainer.step, "save_s": time.perf_counter() - t0}

    def wait_for_saves(self) -> None:
        self.trainer.ckpt.wait()

    def latest_checkpoint(self) -> int | None:
        return self.trainer.ckpt.latest_step() if self.trainer else None

    def params(self) -> Any:
        return self.trainer.params_host()

    def mesh_info(self) -> dict:
        """The mesh as built here: axis sizes and, per position, the owning process (host).

        Lets the driver and tests check that the DCN axis really runs across slices.
        """
        mesh = self.trainer.mesh
        owners = [[[d.process_index for d in row] for row in plane] for plane in mesh.devices]
        return {"axes": dict(mesh.shape), "process_of_device": owners}

    def step(self) -> int:
        return self.trainer.step

    # ---- events and diagnostics ---------------------------------------------------------

    def start_metadata_watcher(self, settings: dict) -> bool:
        """Start the GCE metadata watcher (if this host is on GCE or it is forced)."""
        try:
            from workers.metadata_watcher import start_watcher
        except ImportError:
            return False
        with self._lock:
            if self._watcher is None:
                self._watcher = start_watcher(settings, host=self.host, sink=self._on_event)
        return self._watcher is not None

    def _on_event(self, event: dict) -> None:
        with self._lock:
            self._pending_events.append(event)

    def poll_events(self) -> list[dict]:
        with self._lock:
            out, self._pending_events = self._pending_events, []
        return out

    def stacks(self) -> str:
        """Python stacks of every thread (written to RUN_DIR/diagnostics on a timeout)."""
        buf = io.StringIO()
        for tid, frame in sys._current_frames().items():
            buf.write(f"--- thread {tid}\n")
            buf.write("".join(traceback.format_stack(frame)))
        return buf.getvalue()

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
