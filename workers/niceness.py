"""Lower the CPU priority of the calling thread (Linux: niceness is per thread).

The RAM tier's durable writer shares the host's cores with the training step; at the lowest
priority it runs in the gaps the step leaves instead of taking time slices from it. Not the
threads that carry the copies themselves: at a lower priority a copy lagged the step it copies
(a kill -9 then restored 2 steps back, against the tier's promise of at most 1).
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

LOWEST = 19
"""Linux's lowest priority: the durable writer and the compile ahead run at it."""


def lower_this_thread(nice: int, *, what: str) -> None:
    """Set this thread's niceness to ``nice`` (only ever lowers priority: no privilege needed);
    logged and ignored where the platform cannot."""
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError) as exc:
        log.warning("could not lower the priority of %s: %s", what, exc)


def idle_this_thread(*, what: str) -> bool:
    """Put this thread in Linux's SCHED_IDLE class: it runs only when a core would otherwise be
    idle, and a waking normal thread preempts it at once (nice 19 is still a normal thread a
    waking one may wait behind). No privilege needed to enter it; False where unavailable."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        return True
    except (OSError, AttributeError) as exc:
        log.warning("could not put %s in the idle scheduling class: %s", what, exc)
        return False
