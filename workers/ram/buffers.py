"""Buffers of a whole copy's size, their pages mapped in one call (``MAP_POPULATE``).

A fresh buffer filled page by page takes one fault per 4 KiB page: on a VM such as this
project's machines (Firecracker) that ran at 0.4–1.7 GB/s, so receiving a 1 GiB restore into a
``bytearray`` took 3.5 s where the socket alone needs 0.7 s; mapping the pages in one call took
0.46 s, and the receive then ran at the socket's speed. The buffer is page-aligned too, so a
piece at an aligned offset is placed on a CPU device without a copy. Used for the buffers a
host fills and keeps to itself (the pack, a restore's receive); never for bytes that cross Ray
(an ``mmap`` does not pickle).
"""

from __future__ import annotations

import mmap

SMALL = 1 << 20
"""Below this a plain ``bytearray`` (a mapping per small copy costs more than it saves)."""


def new(nbytes: int) -> bytearray | mmap.mmap:
    """A writable buffer of ``nbytes`` bytes, every page already mapped where the platform
    can (Linux), else a ``bytearray``."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if nbytes < SMALL or not populate:
        return bytearray(nbytes)
    try:
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    except OSError:  # no room for the mapping at once: the kernel maps as it is written
        return bytearray(nbytes)
