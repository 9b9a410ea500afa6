"""Distributed init of a group of host actors, bounded by ``timeouts.init_s`` as a whole.

The hosts give up at ``HOST_INIT_SHARE`` of the bound (JAX aborts a few seconds later); the
driver keeps one second back to ask which stuck hosts never reached JAX's init, so a hang names
the host that hung, not every host waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from orchestrator.controller.seam import GroupFailed, Hung
from orchestrator.raygroup.cluster_view import wait_listening
from orchestrator.shared.host_env import HOST_INIT_SHARE

PROBE_S = 1.0


def join_group(actors: Sequence[Any], *, init_s: float,
               wait: Callable[[list[Any], str, float], list[Any]]) -> None:
    """Join one JAX distributed runtime, coordinator on host 0; ``wait`` is the group's
    bounded call (raises ``GroupFailed``)."""
    t0, refs = time.monotonic(), []

    def left() -> float:
        return max(0.1, init_s - PROBE_S - (time.monotonic() - t0))

    try:
        coord = wait([actors[0].coordinator_address.remote()], "init", left())[0]
        refs = [actors[0].initialize.remote(coord, len(actors), 0)]
        # A client that finds no service retries after ~1 s: ask the others once process 0's
        # coordination service listens (bounded: they would still connect, only later).
        host, port = coord.rsplit(":", 1)
        wait_listening(host, int(port), timeout_s=min(5.0, left()))
        refs += [a.initialize.remote(coord, len(actors), i)
                 for i, a in enumerate(actors) if i > 0]
        wait(refs, "init", left())
    except GroupFailed as exc:
        stuck = exc.status.hosts if isinstance(exc.status, Hung) else ()
        # A host that never joins makes its peers' initialize fail when the coordinator gives
        # up: then the hang is the cause, not the peers' deaths.
        if not stuck and refs and time.monotonic() - t0 >= 0.9 * HOST_INIT_SHARE * init_s:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=left())
            stuck = tuple(i for i, r in enumerate(refs) if r not in ready)
        if not stuck:
            raise
        raise GroupFailed(Hung(phase="init", hosts=never_joined(actors, stuck),
                               seconds=init_s)) from exc


def never_joined(actors: Sequence[Any], stuck: tuple[int, ...]) -> tuple[int, ...]:
    """Of the stuck hosts, those that never reached JAX's init (the others wait for them);
    all of them when none can be told apart."""
    refs = [actors[i].joining.remote() for i in stuck]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_S)
    out = []
    for i, r in zip(stuck, refs, strict=True):
        try:
            joined = r in ready and bool(ray.get(r))
        except Exception:  # a dead host did not join either
            joined = False
        if not joined:
            out.append(i)
    return tuple(out) or stuck
