"""Read-ahead for a source whose position is the step: while step ``s`` trains, a few threads
read the same rows of steps ``s+1 … s+k``.

Why not Grain's iterator prefetch (``to_iter_dataset(ReadOptions(...))`` /
``ThreadPrefetchIterDataset``): an iterator has a position of its own, which would have to go
into every checkpoint tier and be re-cut on a resize; here the position stays the step. And the
trainer asks for several row ranges per step (one per device shard and micro-batch), which the
read-ahead learns from the requests it sees: whatever ranges step ``s`` asked for, it reads for
the next steps. A read is a pure function of its key, so prefetching never changes a result
(tested); a miss (the first step, a jump after a restore) just reads in the caller's thread.

No host hangs on a read: a prefetched read not done within ``timeout_s`` is a ``DataError``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from orchestrator.shared.errors import DataError

Key = tuple[int, int, int, int]
"""(seed, step, first row, row after the last)."""


class ReadAhead:
    def __init__(self, read: Callable[[int, int, int, int], Any], *, steps: int, threads: int,
                 timeout_s: float, setting: str = "data.prefetch_steps",
                 max_pending: int = 1024) -> None:
        self._read = read
        self.steps, self.timeout_s, self.setting = steps, timeout_s, setting
        self.max_pending = max_pending
        self._pool = (ThreadPoolExecutor(threads, thread_name_prefix="input-prefetch")
                      if steps > 0 and threads > 0 else None)
        self._pending: dict[Key, Future] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, seed: int, step: int, start: int, stop: int) -> Any:
        """The rows ``[start, stop)`` of ``step``: the prefetched read if there is one, else
        read now; then schedule the same rows of the next ``steps`` steps."""
        key = (seed, step, start, stop)
        with self._lock:
            future = self._pending.pop(key, None)
            self._forget(step)
            self._schedule(seed, step, start, stop)
        if future is None:
            self.misses += 1
            return self._read(*key)
        self.hits += 1
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise DataError(self.setting, f"reading rows {start}..{stop - 1} of step {step} "
                            f"took longer than {self.timeout_s:.0f} s (a stalled file system "
                            "or bucket)", "check the data's storage; raise "
                            "data.read_timeout_s if reads are this slow") from None

    def _forget(self, step: int) -> None:
        """Drop reads of steps behind ``step`` or beyond the window (a restore moved back)."""
        for key in [k for k in self._pending if not step <= k[1] <= step + self.steps]:
            self._pending.pop(key).cancel()

    def _schedule(self, seed: int, step: int, start: int, stop: int) -> None:
        if self._pool is None:
            return
        for ahead in range(step + 1, step + 1 + self.steps):
            key = (seed, ahead, start, stop)
            if key not in self._pending and len(self._pending) < self.max_pending:
                self._pending[key] = self._pool.submit(self._read, *key)

    def close(self) -> None:
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
