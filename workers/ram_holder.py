"""A node's holder of host-RAM checkpoint copies: its own host's and one peer's.

Runs as a detached, named Ray actor per node (``orchestrator.ram_tier``), so a copy outlives
both the host actor that sent it (kill -9, a new incarnation) and the driver (autoresume).
Copies arrive as plain ``bytes`` (pickled in-band, so this process owns its copy: nothing here
points into an object-store buffer whose owner may die). No JAX.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass


@dataclass
class _Copy:
    incarnation: int
    step: int
    source: int
    sources: int
    layout: list
    data: bytes
    crc32: int


def checksum(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


class RamHolder:
    """Keeps the newest ``keep`` copies per writer (the node that sent them)."""

    def __init__(self, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.keep = keep
        self._lock = threading.Lock()
        self._copies: dict[str, list[_Copy]] = {}

    def put(self, writer: str, *, incarnation: int, step: int, source: int, sources: int,
            layout: list, data: bytes, crc32: int) -> int:
        """Store one copy (replacing the same writer's copy of the same step); returns the
        bytes this holder keeps in all."""
        copy = _Copy(incarnation=incarnation, step=step, source=source, sources=sources,
                     layout=layout, data=data, crc32=crc32)
        with self._lock:
            mine = [c for c in self._copies.get(writer, [])
                    if (c.incarnation, c.step) != (incarnation, step)]
            mine.append(copy)
            mine.sort(key=lambda c: (c.step, c.incarnation))
            self._copies[writer] = mine[-self.keep:]
            return self._nbytes()

    def inventory(self) -> list[dict]:
        """Every copy held, its checksum verified now (memory can rot; a copy may be bad)."""
        with self._lock:
            copies = [c for mine in self._copies.values() for c in mine]
        return [{"incarnation": c.incarnation, "step": c.step, "source": c.source,
                 "sources": c.sources, "nbytes": len(c.data),
                 "intact": checksum(c.data) == c.crc32} for c in copies]

    def get(self, *, incarnation: int, step: int, source: int) -> dict:
        """One copy with its layout and checksum (the reader verifies it again)."""
        with self._lock:
            for mine in self._copies.values():
                for c in mine:
                    if (c.incarnation, c.step, c.source) == (incarnation, step, source):
                        return {"layout": c.layout, "data": c.data, "crc32": c.crc32}
        raise KeyError(f"no copy of source {source} at step {step} (incarnation {incarnation})")

    def stats(self) -> dict:
        with self._lock:
            return {"copies": sum(len(m) for m in self._copies.values()),
                    "nbytes": self._nbytes()}

    def damage(self, *, step: int, source: int) -> bool:
        """Flip one byte of a copy (chaos/tests: a corrupted replica must be refused)."""
        with self._lock:
            for mine in self._copies.values():
                for c in mine:
                    if (c.step, c.source) == (step, source) and c.data:
                        c.data = bytes([c.data[0] ^ 0xFF]) + c.data[1:]
                        return True
        return False

    def _nbytes(self) -> int:
        return sum(len(c.data) for mine in self._copies.values() for c in mine)
