"""Room for a save on a local checkpoint disk, checked before the save starts.

A save that meets a full disk inside Orbax's async commit does not fail the host's call: the
primary host's commit thread dies with ENOSPC while its peers wait for it at Orbax's barrier,
and the group only ends at the step bound, as a hang, retried (issue 28, item 7; found by
``bench.faults``' disk-full row). So every host checks, before it starts a save, that the
checkpoint directory's filesystem has room for one more checkpoint (the state's global bytes),
and raises ``OSError(ENOSPC)`` in its own call when not: the driver maps that to a storage
fault that stops the run with the fix (``orchestrator.raygroup.results.storage_fault``), before any
half-written step exists. Remote paths (``gs://``) are not checked: their quota errors surface
as the save's own error.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any


def state_bytes(state: Any) -> int:
    """Global bytes of a state pytree's arrays (metadata only, no device transfer)."""
    import jax

    return int(sum(int(getattr(x, "nbytes", 0) or 0) for x in jax.tree.leaves(state)))


def free_bytes(directory: str) -> int | None:
    """Free bytes of the filesystem holding ``directory`` (its nearest existing parent); None
    for a remote path."""
    if "://" in directory:
        return None
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_room(directory: str, need_bytes: int) -> None:
    """Raise ``OSError(ENOSPC)`` when ``directory``'s local filesystem has less than
    ``need_bytes`` free: the save would not fit."""
    free = free_bytes(directory)
    if free is not None and free < need_bytes:
        raise OSError(errno.ENOSPC, f"No space left on device: {free} bytes free for the "
                      f"checkpoint storage, a save needs about {need_bytes}", directory)
