"""The host actor's warm-process methods (a mixin of ``workers.host.actor.HostActor``): a standby's
imports, and leaving one JAX runtime in process to join the next
(``orchestrator/raygroup/warm_pool.py`` drives them). Kept apart so the actor's module stays
about stepping and checkpoints.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import MEGASCALE_KEYS
from workers.host.ahead import AHEAD_JOIN_S
from workers.host.stops import StopBoard

log = logging.getLogger(__name__)

RELEASE_BARRIER_S = 10
"""How long ``release`` waits for the other processes at the runtime's shutdown barrier."""


def apply_env(env: Mapping[str, str], environ: MutableMapping[str, str] = os.environ) -> None:
    """Set this host's ``env`` (``device_env``) in the process before JAX starts a backend:
    the plan's multislice keys it does not set are removed, never kept from an older mesh or
    the node (a stale ``MEGASCALE_NUM_SLICES`` makes libtpu wait for slices that are gone)."""
    for key in MEGASCALE_KEYS:
        if key not in env:
            environ.pop(key, None)
    environ.update(env)


def _clear_orbax_caches() -> None:
    """Orbax caches its signaling client, which holds the JAX distributed client of the group
    just left (its saves would then talk to a coordinator that is gone). Semi-internal: if
    this moves in another Orbax, release fails and the driver starts a fresh process."""
    from orbax.checkpoint._src.futures import signaling_client

    signaling_client.get_signaling_client.cache_clear()


def _free_device_objects() -> None:
    """Arrays and executables must be gone before the backends are cleared (on a TPU the next
    backend cannot open chips an old client still holds). Dropping the trainer frees them by
    reference count; only if some survive (in reference cycles) is a full collection run:
    it walks every object of the process (~0.1 s of a switch here)."""
    import gc

    import jax
    from jax.extend import backend

    jax.clear_caches()
    alive = len(jax.live_arrays()), len(backend.get_backend().live_executables())
    if any(alive):  # something holds the trainer's objects in a cycle: worth finding
        gc.collect()
        log.warning("collected to free %d arrays and %d executables left in reference cycles; "
                    "%d and %d remain", *alive, len(jax.live_arrays()),
                    len(backend.get_backend().live_executables()))


class WarmMethods:
    """Needs from the actor: ``spec``, ``host``, ``trainer``, ``_lock``, ``_watcher``,
    ``_replicator``, ``_persist``, ``_stops``, ``_step``, ``_fault``."""

    spec: Any
    host: Any
    trainer: Any
    _lock: threading.Lock
    _watcher: Any
    _replicator: Any
    _persist: dict | None
    _stops: StopBoard
    _step: int
    _fault: dict | None
    _leaving: bool

    def warm(self, task: Any = None, train: Any = None, total_steps: int | None = None,
             seed: int = 0) -> dict:
        """Import what a host needs (JAX, Flax, Optax, Orbax, the step's module) without
        starting a backend, so that ``rejoin`` + ``initialize`` pay no imports; given the run's
        ``task`` (a ``TaskRef``), ``train``, ``total_steps`` and ``seed``, also resolve the
        task and trace the state's shapes (``build`` then skips them inside a switch)."""
        t0 = time.perf_counter()
        import jax  # noqa: F401
        import orbax.checkpoint  # noqa: F401

        import workers.training.trainer  # noqa: F401  (the step's module)

        if task is not None and train is not None and total_steps is not None:
            from workers.task.contract import TaskContext
            from workers.task.resolve import resolve

            ctx = TaskContext(train=train, total_steps=total_steps, seed=seed)
            resolve(task, ctx).abstract_boxed  # noqa: B018  (cached for build)
        return {"pid": os.getpid(), "warm_s": time.perf_counter() - t0}

    def quiesce(self, ahead_wait_s: float = AHEAD_JOIN_S) -> dict:
        """The first half of ``release``, run on every host at once: stop the metadata watcher
        and the RAM copies, finish pending saves (they may need every host) and drop the
        trainer. A compile ahead still running is waited for up to ``ahead_wait_s`` (the next
        group may load it); past that, ``release`` refuses. Idempotent."""
        t0 = time.perf_counter()
        with self._lock:
            self._leaving = True  # no compile ahead starts from now on
        try:
            self.wait_ahead(ahead_wait_s)  # type: ignore[attr-defined]  (AheadMethods)
        except RuntimeError as exc:
            log.warning("%s: this process will not be reused", exc)
        with self._lock:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None
        if self._replicator is not None:
            self._replicator.close()
            self._replicator, self._persist = None, None
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
            _free_device_objects()
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
        if self.ahead_running():  # type: ignore[attr-defined]  (AheadMethods)
            raise RuntimeError("a compile ahead is still running: leaving the runtime would "
                               "clear the backend under it (the driver starts a fresh process)")
        import jax
        from jax.extend import backend

        t1 = time.perf_counter()
        jax.distributed.shutdown()
        t2 = time.perf_counter()
        backend.clear_backends()
        jax.clear_caches()
        _clear_orbax_caches()
        self._stops, self._step, self._fault, self._in_step = StopBoard(), 0, None, False
        t3 = time.perf_counter()
        return {"pid": os.getpid(), "release_s": t3 - t0, "quiesce_s": t1 - t0,
                "shutdown_s": t2 - t1, "clear_s": t3 - t2}

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
        self._leaving = False
        return {"pid": os.getpid()}
