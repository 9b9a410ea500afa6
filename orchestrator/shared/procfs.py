"""One reader of ``/proc/<pid>/stat`` for everything that asks the kernel about a process."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command name (which may hold spaces and
    parentheses): index 0 is the state (field 3), 1 the parent pid, 19 the start time (field
    22), 49 a zombie's wait status (field 52). None once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None
