"""Lower the CPU priority of the calling thread (Linux: niceness is per thread).

The RAM tier's background work (sending copies, receiving them, writing them durably) shares
the host's cores with the training step; at a lower priority it runs in the gaps the step
leaves (collectives, input) instead of taking time slices from it.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)


def lower_this_thread(nice: int, *, what: str) -> None:
    """Set this thread's niceness to ``nice`` (only ever lowers priority: no privilege needed);
    logged and ignored where the platform cannot."""
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError) as exc:
        log.warning("could not lower the priority of %s: %s", what, exc)
