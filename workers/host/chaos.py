"""Faults a test or a chaos run arms on one host (``HostActor.inject_fault``).

Each fires once, where the real failure would strike (before a step, inside an async save, at
the distributed init), so the recovery paths run against the failures they exist for. Kept out
of the step loop so that loop reads as training.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def _crash_later(after_s: float) -> None:
    """SIGSEGV to this process ``after_s`` from now, as a native crash would end it (no
    cleanup, no flush); SIGKILL if a fault handler kept it alive."""
    time.sleep(after_s)
    log.warning("chaos: SIGSEGV to this host process (pid %d)", os.getpid())
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(5.0)
    os.kill(os.getpid(), signal.SIGKILL)


class Chaos:
    """The one fault armed on this process (``{"at_step", "kind", ...}``), or none."""

    def __init__(self) -> None:
        self._fault: dict | None = None

    def inject(self, fault: dict | None) -> None:
        """Arm ``fault`` (replacing any armed one); ``crash`` is started, not armed."""
        if fault and fault["kind"] == "crash":
            threading.Thread(target=_crash_later, args=(float(fault.get("after_s", 1.0)),),
                             name="chaos-crash", daemon=True).start()
            return
        self._fault = fault

    def clear(self) -> None:
        """Forget an armed fault: it was meant for the group this process leaves."""
        self._fault = None

    def at_init(self) -> None:
        """``hang_init``: never reach the distributed init (a host that does not come up)."""
        f = self._fault
        if f and f["kind"] == "hang_init":
            self._fault = None
            time.sleep(f.get("seconds", 3600))

    def before_step(self, step: int, *, settle_saves: Callable[[], None]) -> None:
        """``kill``, ``hang`` or ``error`` once ``step`` (the step done) reaches ``at_step``.

        A kill lets earlier async saves commit first (``settle_saves``), so the restore point
        does not depend on how fast this machine writes; ``kill_in_save`` covers the kill
        that lands while a save is in flight."""
        f = self._fault
        if not f or f["kind"] not in ("kill", "hang", "error") or step < f["at_step"]:
            return
        self._fault = None
        if f["kind"] == "kill":
            settle_saves()
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9: no cleanup, no flush
        if f["kind"] == "hang":
            time.sleep(f.get("seconds", 3600))
        if f["kind"] == "error":
            raise RuntimeError(f"injected application error at step {step}")

    def in_save(self, step: int) -> None:
        """``kill_in_save``: SIGKILL right after step ``step``'s async save started."""
        f = self._fault
        if f and f["kind"] == "kill_in_save" and step >= f["at_step"]:
            os.kill(os.getpid(), signal.SIGKILL)  # the async save is still being written
