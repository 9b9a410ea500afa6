"""Stop requests for a running chunk of steps, keyed by chunk id (pure, thread-safe).

The driver asks every host to stop chunk ``c`` once its step reaches ``s``; the host's step loop
reads the request between steps. Ray runs a threaded actor's calls in any order, so a request
may arrive before the chunk it names has started (it is kept for it) or after that chunk ended
and the next one began (it is dropped: chunk ids only grow during an actor's life, so an id
below the newest started chunk is stale). No request ever leaks into another chunk.
"""

from __future__ import annotations

import threading


class StopBoard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stops: dict[int, int] = {}
        self._newest: int | None = None
        """The newest chunk started; ids below it are stale."""
        self._ended: int | None = None
        """The newest chunk finished; it and older ids are stale."""

    def _stale(self, chunk: int) -> bool:
        return ((self._newest is not None and chunk < self._newest)
                or (self._ended is not None and chunk <= self._ended))

    def begin(self, chunk: int) -> None:
        """A chunk starts: requests for older chunks are stale from now on."""
        with self._lock:
            if self._stale(chunk):
                raise ValueError(f"chunk id {chunk} was already used (newest started "
                                 f"{self._newest}); chunk ids must increase")
            self._newest = chunk
            self._stops = {c: s for c, s in self._stops.items() if c >= chunk}

    def request(self, chunk: int, at_step: int) -> bool:
        """Ask ``chunk`` to stop at ``at_step``; False when the request is stale (ignored).

        Two requests for one chunk keep the earlier step."""
        with self._lock:
            if self._stale(chunk):
                return False
            prev = self._stops.get(chunk)
            self._stops[chunk] = at_step if prev is None else min(prev, at_step)
            return True

    def stop_at(self, chunk: int) -> int | None:
        """The step at which ``chunk`` must stop, if a stop was requested."""
        with self._lock:
            return self._stops.get(chunk)

    def end(self, chunk: int) -> None:
        """The chunk finished: its request (if any) is spent."""
        with self._lock:
            self._stops.pop(chunk, None)
            self._ended = chunk if self._ended is None else max(self._ended, chunk)
