"""Lower the CPU priority of a thread of this process (Linux: niceness and scheduling class are
per thread, and inherited by the threads it starts).

Work beside the training step that must not delay it: the compile ahead runs at nice 19; the RAM
tier's copy sender and its holders' durable writer run in the idle class, which takes only the
time the step leaves a core idle (at nice 19 they still slowed the step, as bench/RESULTS.md
measures). A copy the step then waits for is the copy sender's concern
(``workers.ram.replicator``: it moves to normal priority when starved). Gloo's event loop goes
to the idle class too, for another reason: it busy-polls (``workers.host.gloo_loop``).
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

LOWEST = 19
"""Linux's lowest priority: the compile ahead runs at it."""


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
    return idle_thread(threading.get_native_id(), what=what)


def idle_thread(tid: int, *, what: str) -> bool:
    """``idle_this_thread`` for thread ``tid`` of this process (``workers.host.gloo_loop``)."""
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return True
    except (OSError, AttributeError) as exc:
        log.warning("could not put %s in the idle scheduling class: %s", what, exc)
        return False
