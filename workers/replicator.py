"""A host's side of the RAM tier: after every ``every`` steps, send its copy to its holders.

At most one copy per holder is in flight: before sending step s the host waits (bounded) for
step s - every to be delivered, so with ``keep >= 2`` every holder has a complete older set
while the newest arrives. A holder that fails is dropped for the rest of this incarnation and
logged: the RAM tier is an optimisation, it never stops training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workers import replica
from workers.ram_holder import checksum

log = logging.getLogger(__name__)


@dataclass
class ReplicaStats:
    copies: int = 0
    bytes_per_copy: int = 0
    sent_bytes: int = 0
    blocking_s: float = 0.0
    dropped: list[str] = field(default_factory=list)
    disabled: str = ""
    persist_requests: int = 0

    def as_dict(self) -> dict:
        return {"copies": self.copies, "bytes_per_copy": self.bytes_per_copy,
                "sent_bytes": self.sent_bytes, "blocking_s": round(self.blocking_s, 4),
                "dropped": list(self.dropped), "disabled": self.disabled,
                "persist_requests": self.persist_requests}


class Replicator:
    """``holders``: (name, actor handle) of this host's own-node holder and its peer's."""

    def __init__(self, holders: Sequence[tuple[str, Any]], *, writer: str, incarnation: int,
                 source: int, sources: int, every: int, keep: int, max_host_bytes: int,
                 deliver_timeout_s: float = 30.0) -> None:
        self.holders = list(holders)
        self.writer = writer
        self.incarnation = incarnation
        self.source = source
        self.sources = sources
        self.every = every
        self.keep = keep
        self.max_host_bytes = max_host_bytes
        self.deliver_timeout_s = deliver_timeout_s
        self._in_flight: list[tuple[str, Any]] = []
        self.stats = ReplicaStats()

    def after_step(self, step: int, state: Any, *, persist: dict | None = None,
                   force: bool = False) -> float:
        """Copy ``state`` (now at ``step``) if due, forced, or ``persist`` asks for it (then the
        first live holder, this node's, also saves it durably: ``RamHolder.put``); returns the
        seconds this step was blocked."""
        due = step % self.every == 0 or persist is not None or force
        if not due or not self.holders or self.stats.disabled:
            return 0.0
        t0 = time.perf_counter()
        self.settle()
        layout, data = replica.pack(state)
        # A holder keeps `keep` copies of this host's and of one peer's, of about this size.
        if len(data) * self.keep * 2 > self.max_host_bytes:
            self.stats.disabled = (f"{len(data)} bytes per copy x {self.keep} kept x 2 hosts "
                                   f"exceeds checkpoint.ram.max_host_bytes={self.max_host_bytes}")
            log.warning("RAM tier off on this host: %s", self.stats.disabled)
            return time.perf_counter() - t0
        crc = checksum(data)
        self._in_flight = [(name, h.put.remote(
            self.writer, incarnation=self.incarnation, step=step, source=self.source,
            sources=self.sources, layout=layout, data=data, crc32=crc,
            persist=persist if i == 0 else None))
            for i, (name, h) in enumerate(self.holders)]
        if persist is not None:
            self.stats.persist_requests += 1
        self.stats.copies += 1
        self.stats.bytes_per_copy = len(data)
        self.stats.sent_bytes += len(data) * len(self.holders)
        dt = time.perf_counter() - t0
        self.stats.blocking_s += dt
        return dt

    def settle(self) -> None:
        """Wait for the copies in flight; drop every holder that failed to take one."""
        import ray

        flight, self._in_flight = self._in_flight, []
        for name, ref in flight:
            try:
                ray.get(ref, timeout=self.deliver_timeout_s)
            except Exception as exc:  # a dead or stuck holder: go on without it
                log.warning("RAM holder %s dropped (%s: %s)", name, type(exc).__name__, exc)
                self.holders = [(n, h) for n, h in self.holders if n != name]
                self.stats.dropped.append(name)
