"""Where a host is, answered on another actor thread while a long call runs: what the driver
asks when a phase passes its bound, so that a hang names the host the others wait for
(``orchestrator/raygroup/hangs.py``, ``policies/hangs.py``), and the stacks it writes to
RUN_DIR/diagnostics then.
"""

from __future__ import annotations

import io
import sys
import traceback

LONG_CALLS = frozenset({"initialize", "build", "restore", "restore_from_ram", "restore_copies",
                        "restore_from_disk_copy", "compile", "run_steps", "save", "copy_now",
                        "params", "quiesce", "release", "rejoin"})
"""The actor's calls that can block (on a peer, the disk, a device)."""
_MODULES = frozenset({"workers.host.actor", "workers.host.ram"})
"""Where those calls are defined: the actor, and the RAM tier, whose ``restore_from_ram`` runs
its ``restore_copies`` (a host inside it says both, as the call it may hang in)."""


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


def stacks() -> str:
    """Python stacks of every thread (written to RUN_DIR/diagnostics on a timeout)."""
    buf = io.StringIO()
    for tid, frame in sys._current_frames().items():
        buf.write(f"--- thread {tid}\n")
        buf.write("".join(traceback.format_stack(frame)))
    return buf.getvalue()


class Position:
    """The host-mirrored step, written by the step loop and restores, read from any thread
    without a lock (an answer never waits for the running call, nor syncs a device)."""

    def __init__(self) -> None:
        self.step = 0
        """The last step finished."""
        self.in_step = False
        """Whether the step after it began (set before each step, cleared after)."""

    def reset(self) -> None:
        """A process leaving its group starts the next one at no step."""
        self.step, self.in_step = 0, False

    def whereabouts(self) -> dict:
        """``{"step", "entered", "calls"}``: ``entered == step + 1`` while inside a step."""
        step = self.step
        return {"step": step, "entered": step + 1 if self.in_step else step,
                "calls": list(running_calls())}
