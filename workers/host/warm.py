"""A warm process: the JAX runtime a host process joins, leaves in process and joins again
(``orchestrator/raygroup/warm_pool.py`` drives it), and a standby's imports paid ahead. A new
group then skips a process start, JAX's imports and a backend's teardown by the OS.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from orchestrator.shared.host_env import HOST_INIT_SHARE, coordinator_bind, loopback_host
from orchestrator.shared.plan import MEGASCALE_KEYS
from orchestrator.shared.worker_log import install as mark_log_records
from workers.host.gloo_loop import idle_after_join

log = logging.getLogger(__name__)

RELEASE_BARRIER_S = 10
"""How long ``release`` waits for the other processes at the runtime's shutdown barrier."""


def apply_env(env: Mapping[str, str], environ: MutableMapping[str, str] = os.environ) -> None:
    """Set this host's ``env`` (``device_env``) in the process before JAX starts a backend:
    the plan's multislice keys it does not set are removed, never kept from an older mesh or
    the node (a stale ``MEGASCALE_NUM_SLICES`` makes libtpu wait for slices that are gone).
    The process's warnings are marked for the driver from here on (``mark_log_records``):
    otherwise they are lost among Gloo's and XLA's lines, or never shown."""
    for key in MEGASCALE_KEYS:
        if key not in env:
            environ.pop(key, None)
    environ.update(env)
    mark_log_records()


def _clear_orbax_caches() -> None:
    """Orbax caches its signaling client, which holds the JAX distributed client of the group
    just left (its saves would then talk to a coordinator that is gone). Private to Orbax
    (``workers.host.orbax_private``): if it moves, release fails and the driver starts a fresh
    process."""
    from workers.host.orbax_private import clear_signaling_client_cache

    clear_signaling_client_cache()


def free_device_objects() -> None:
    """Arrays and executables must be gone before the backends are cleared (on a TPU the next
    backend cannot open chips an old client still holds). Dropping the trainer frees them by
    reference count; only if some survive (in reference cycles) is a full collection run:
    it walks every object of the process, a noticeable part of a switch."""
    import jax
    from jax.extend import backend

    jax.clear_caches()
    alive = len(jax.live_arrays()), len(backend.get_backend().live_executables())
    if any(alive):  # something holds the trainer's objects in a cycle: worth finding
        gc.collect()
        log.warning("collected to free %d arrays and %d executables left in reference cycles; "
                    "%d and %d remain", *alive, len(jax.live_arrays()),
                    len(backend.get_backend().live_executables()))


def warm_imports(task: Any = None, train: Any = None, total_steps: int | None = None,
                 seed: int = 0) -> dict:
    """Import what a host needs (JAX, Flax, Optax, Orbax, the step's module) without starting
    a backend; given the run's ``task`` (a ``TaskRef``), ``train``, ``total_steps`` and
    ``seed``, also resolve the task and trace the state's shapes (``build`` then skips them
    inside a switch)."""
    t0 = time.perf_counter()
    import jax  # noqa: F401

    import workers.training.orbax_import  # Orbax, without its Cloud Logging backend
    import workers.training.trainer  # noqa: F401  (the step's module)

    if task is not None and train is not None and total_steps is not None:
        from workers.task.contract import TaskContext
        from workers.task.resolve import resolve

        ctx = TaskContext(train=train, total_steps=total_steps, seed=seed)
        resolve(task, ctx).abstract_boxed  # noqa: B018  (cached for build)
    return {"pid": os.getpid(), "warm_s": time.perf_counter() - t0}


class JaxRuntime:
    """This process's membership of a JAX distributed group: ``prepare`` and ``join`` enter
    one (``HostActor.initialize``), ``leave`` leaves it in process (``HostActor.release``)."""

    def __init__(self) -> None:
        self.joining = False
        """Whether ``join`` reached JAX's init (answers while it blocks there)."""

    @staticmethod
    def prepare() -> None:
        """The step's imports, then a freeze: what exists now (Ray, the imports) lives as long
        as the process, so it is left out of the collections ``quiesce`` needs (a noticeable
        part of a switch otherwise). No backend exists yet, so none of its objects is frozen:
        ``leave`` can still free them."""
        import jax  # noqa: F401

        import workers.training.trainer  # noqa: F401  (the step's imports, before the freeze)

        gc.freeze()

    def join(self, coordinator: str, num_processes: int, process_id: int, *,
             survive_peers: bool, init_timeout_s: float, heartbeat_s: float) -> dict:
        """Join the JAX group within ``HOST_INIT_SHARE`` of ``init_timeout_s``
        (``orchestrator.raygroup.runtime``). A coordinator on loopback (the emulated and local
        clusters) keeps every listener of the group there: the coordinator's, which JAX
        otherwise opens on every interface, and gloo's, which JAX puts on the host name's
        address."""
        import jax

        from workers.training import jax_private

        # a peer's death then fails our collectives instead of aborting this process (the
        # default), so ``release`` can keep it for the next group
        jax.config.update("jax_enable_recoverability", bool(survive_peers))
        jax_private.gloo_host(loopback_host(coordinator))
        self.joining = True
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
            coordinator_bind_address=coordinator_bind(coordinator),
            initialization_timeout=max(1, int(HOST_INIT_SHARE * init_timeout_s)),
            heartbeat_timeout_seconds=max(2, int(heartbeat_s)),
            # ``release`` shuts the runtime down with a barrier: bounded, never JAX's 300 s
            shutdown_timeout_seconds=RELEASE_BARRIER_S)
        idled = idle_after_join(num_processes)
        return {"process_index": jax.process_index(), "local_devices": jax.local_device_count(),
                "global_devices": jax.device_count(), "platform": jax.devices()[0].platform,
                "gloo_loop_idled": len(idled)}

    @staticmethod
    def leave() -> dict:
        """Shut the distributed runtime down (a barrier with the other processes) and clear
        JAX's and Orbax's backends and caches; raises if it cannot. Needs the trainer's
        arrays gone first (``free_device_objects``)."""
        import jax
        from jax.extend import backend

        t0 = time.perf_counter()
        jax.distributed.shutdown()
        t1 = time.perf_counter()
        backend.clear_backends()
        jax.clear_caches()
        _clear_orbax_caches()
        return {"shutdown_s": t1 - t0, "clear_s": time.perf_counter() - t1}
