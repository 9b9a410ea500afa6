"""The host's metadata watcher and the driver's queue its notices go to.

A notice is pushed at once (not left for the driver's next poll), so it survives this host
dying meanwhile; a queue that refuses it or does not answer is retried for a bounded time, and a
notice still refused is logged as lost: nothing on this host would ever read it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from orchestrator.shared.hosts import HostRef
from workers.host.metadata_watcher import MetadataWatcher, put_bounded, start_watcher

log = logging.getLogger(__name__)

_SINK_TRIES = 6  # a refused notice is retried after 0.1, 0.2, 0.4, 0.8, 1.6 s (3.1 s in all)
_SINK_CALL_TIMEOUT_S = 2.0


class Notices:
    """The watcher this host started (if it runs here) and the sink it forwards to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sink: Any = None
        """A driver-owned ``ray.util.queue.Queue`` (anything with ``put_nowait``)."""
        self._watcher: MetadataWatcher | None = None

    def start(self, settings: dict, sink: Any, host: HostRef | None) -> bool:
        """Watch for ``host`` with ``settings`` (the ``events.metadata`` section), forwarding
        to ``sink`` (a later call only replaces the sink); False when it does not run here."""
        with self._lock:
            self._sink = sink
            if self._watcher is None:
                self._watcher = start_watcher(settings, host=host, sink=self._forward)
        return self._watcher is not None

    def stop(self) -> None:
        """Stop watching (the process leaves its group, or ends); a no-op when not watching."""
        with self._lock:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None

    def _forward(self, event: dict) -> None:
        """Hand a notice to the sink (on the watcher's thread), retried with backoff for ~3 s
        (``put_bounded`` abandons a put the queue does not answer); then logged as lost, by
        id, at ERROR."""
        delay, last = 0.1, None
        for attempt in range(_SINK_TRIES):
            try:
                put_bounded(self._sink, event, _SINK_CALL_TIMEOUT_S)
                return
            except Exception as exc:
                last = exc
                if attempt + 1 < _SINK_TRIES:
                    time.sleep(delay)
                    delay *= 2
        log.error("metadata notice %s (%s) lost: the driver's queue refused it %d times "
                  "(%s: %s)", event.get("id"), event.get("kind"), _SINK_TRIES,
                  type(last).__name__, last)
