"""Lower the CPU priority of the calling thread (Linux: niceness is per thread).

The RAM tier's threads share the host's cores with the training step; at the lowest priority
they run in the gaps the step leaves instead of taking time slices from it. That holds for the
durable writer and, since a step waits for the previous copy to arrive (``replicator``'s
``LAG_WAIT_S``: a copy cannot lag more than one step), for the threads that carry the copies
too: measured side by side (bench.tiers ram-ab, 2 cores), a step with the RAM tier every step
cost 1.085x one without at the holders' and the sender's default priority, 1.03x at 19, with no
longer wait for the previous copy (about 1 ms either way). Before that wait existed, a copy at
the lowest priority could lag its step and a kill -9 then lost 2 steps.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

LOWEST = 19
"""Linux's lowest priority: the RAM tier's threads (durable writer, copy sender, holder
connections) run at it."""


def lower_this_thread(nice: int, *, what: str) -> None:
    """Set this thread's niceness to ``nice`` (only ever lowers priority: no privilege needed);
    logged and ignored where the platform cannot."""
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError) as exc:
        log.warning("could not lower the priority of %s: %s", what, exc)
