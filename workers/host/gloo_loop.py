"""Gloo's TCP event loop in the idle scheduling class, on the CPU platform.

JAX's collectives between CPU processes go over gloo. Its TCP event loop leaves a readable
socket unread until the local side has posted the matching receive, so its level-triggered
``epoll_wait`` returns at once, again and again: thousands of calls a second under contention
(seen with ``strace``; gloo issue 246, open, is about the same loop's wake-ups). With more runnable
threads than cores (the emulated cluster: several host processes per core, beside Ray's
daemons), the loop takes the core from the very thread it waits for. Beside one busy process on
2 cores the bare loop's step is many times faster and takes less CPU in the idle class; alone it
is the same (``bench.gloo_loop``; its figures are in bench/RESULTS.md).

The trade-off: an idle-class thread still runs beside normal ones, but with a tiny share
(weight 3 against 1,024), so under long foreign load at normal priority its messages wait and
steps slow down (``timeouts.step_s`` still bounds them); a process cannot leave the class again
without privilege. The loop thread is the one thread the CPU backend's start leaves waiting in
``epoll_wait``; if there is not exactly one, none is touched. No other platform's backend uses
gloo, and a single process has no peer to wait for: both are left alone.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable

from workers.host.niceness import idle_thread

log = logging.getLogger(__name__)

_EPOLL_SYSCALLS = {"x86_64": {"232", "281", "441"}, "aarch64": {"22", "441"}}
"""epoll_wait, epoll_pwait, epoll_pwait2 (numbers of the kernel's syscall table)."""

SAMPLES = 20
"""How often the new threads are looked at (a loop thread busy at one look waits at another)."""


def threads() -> set[int]:
    """This process's thread ids."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _waiting_in_epoll(tid: int, calls: set[str]) -> bool:
    try:
        with open(f"/proc/self/task/{tid}/syscall", encoding="ascii") as f:
            return f.read().split(" ", 1)[0] in calls
    except (OSError, IndexError):
        return False


def idle_gloo_loop(before: set[int], start_backend: Callable[[], str], *,
                   num_processes: int) -> list[int]:
    """Start the backend (``start_backend`` returns its platform); on the CPU platform with
    peers, put the one thread it started that waits in ``epoll_wait`` in the idle class.
    ``before``: ``threads()`` after ``jax.distributed.initialize``, before anything started the
    backend. Returns the thread ids idled (none elsewhere, where the kernel's table is unknown,
    or where not exactly one thread qualifies)."""
    backend = start_backend()
    calls = _EPOLL_SYSCALLS.get(platform.machine())
    if backend != "cpu" or num_processes < 2 or not calls or not before:
        return []
    started = threads() - before  # the backend's: later threads are never candidates
    found: set[int] = set()
    for i in range(SAMPLES):
        found |= {t for t in started if _waiting_in_epoll(t, calls)}
        if found and i >= 2:
            break
        time.sleep(0.01)
    if len(found) != 1:
        log.warning("expected one gloo event loop among the backend's threads, found %d; none "
                    "idled (collectives may busy-poll a core)", len(found))
        return []
    return [t for t in found if idle_thread(t, what="gloo's event loop")]


def idle_after_join(num_processes: int) -> list[int]:
    """``idle_gloo_loop`` for a process that has just run ``jax.distributed.initialize`` and
    has no backend yet: JAX's backend is started here."""
    import jax

    return idle_gloo_loop(threads(), lambda: jax.devices()[0].platform,
                          num_processes=num_processes)
