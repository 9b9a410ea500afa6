"""Where a host is (a mixin of ``workers.host.actor.HostActor``), answered on another actor thread
while a long call runs: what the driver asks when a phase passes its bound, so that a hang
names the host the others wait for (``orchestrator/raygroup/hangs.py``, ``policies/hangs.py``),
and the stacks it writes to RUN_DIR/diagnostics then.
"""

from __future__ import annotations

import io
import sys
import traceback

LONG_CALLS = frozenset({"initialize", "build", "restore", "restore_from_ram", "restore_copies",
                        "restore_from_disk_copy", "compile", "run_steps", "save", "copy_now",
                        "params", "quiesce", "release", "rejoin"})
"""The actor's calls that can block (on a peer, the disk, a device)."""
_MODULES = frozenset({"workers.host.actor", "workers.host.ram", "workers.host.warm",
                      "workers.host.ahead"})


def running_calls() -> tuple[str, ...]:
    """The actor's long calls that some thread of this process is inside now, by name."""
    found: set[str] = set()
    for frame in sys._current_frames().values():
        f = frame
        while f is not None:
            code = f.f_code
            if code.co_name in LONG_CALLS and f.f_globals.get("__name__") in _MODULES:
                found.add(code.co_name)
            f = f.f_back
    return tuple(sorted(found))


class WhereMethods:
    """Needs from the actor: ``_step`` (the last step finished) and ``_in_step`` (whether
    the step after it began: ``run_steps`` sets it before each step, clears it after)."""

    _step: int
    _in_step: bool

    def whereabouts(self) -> dict:
        """``{"step", "entered", "calls"}``: ``entered == step + 1`` while inside a step; an
        answer never waits for the running call (no lock, no device sync)."""
        step = self._step
        return {"step": step, "entered": step + 1 if self._in_step else step,
                "calls": list(running_calls())}

    def stacks(self) -> str:
        """Python stacks of every thread (written to RUN_DIR/diagnostics on a timeout)."""
        buf = io.StringIO()
        for tid, frame in sys._current_frames().items():
            buf.write(f"--- thread {tid}\n")
            buf.write("".join(traceback.format_stack(frame)))
        return buf.getvalue()
