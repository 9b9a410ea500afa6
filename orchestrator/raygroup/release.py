"""How a group's processes end at its release: killed, or parked in the warm pool for the next
group. Kept apart from ``group`` (which forms and drives a group) because the decision reads
what the release is for: a drain, a failure, or a notice that dooms the whole group."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import ray
import structlog
from ray.exceptions import RayActorError

from orchestrator.raygroup.warm_pool import WarmPool
from orchestrator.shared.hosts import HostRef

log = structlog.get_logger(__name__)

FAILED_RELEASE_S = 5.0  # after a failure, a survivor's release (stuck on a dead peer) is cut


def all_doomed(hosts: Sequence[HostRef], doomed: Collection[str]) -> bool:
    """Whether a notice dooms every slice of the group (a TPU slice goes as a unit, so a
    doomed host dooms its slice). Such a group is done with once its step is saved or copied:
    kill it rather than park processes that vanish at the deadline. Part of a group is never
    killed so: a save in flight may still need the others."""
    gone = {h.slice_name for h in hosts if h.node_id in doomed}
    return bool(gone) and all(h.slice_name in gone for h in hosts)


def park(pool: WarmPool, hosts: Sequence[HostRef], actors: list[Any], refs: list[Any], *,
         graceful: bool) -> None:
    """Keep the processes for the next group: quiesce them all, then release them (a drained
    group finishes its saves first). After a failure in a chunk (``refs``: its calls) only
    hosts whose chunk returned are released (a dead one's release fails at once; one still
    inside a step is hung) and within a short bound; every other process is killed."""
    busy: set[int] = set()
    if not graceful and refs:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)
        busy = {i for i, r in enumerate(refs) if r not in ready}
        # a host whose chunk ended in its own death is known dead: no release to try
        busy |= {i for i, r in enumerate(refs) if r in ready and _died(r)}
    pairs = [(h.node_id, a) for i, (h, a) in enumerate(zip(hosts, actors, strict=True))
             if i not in busy]
    for i in busy:
        ray.kill(actors[i], no_restart=True)
    kept = pool.park(pairs, coordinator=hosts[0].node_id,
                     timeout_s=None if graceful else FAILED_RELEASE_S)
    log.info("processes_parked", kept=kept, of=len(actors), after_failure=not graceful)


def _died(ref: Any) -> bool:
    """Whether a finished call's actor died (its process is gone)."""
    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except Exception:  # a live host's error
        return False
    return False
