"""Fixtures: an injectable clock and the local MetricService on a loopback port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.metric_server import LocalMetricService


class FakeClock:
    """A clock tests move by hand; ``sleep`` advances it (and records the delays)."""

    def __init__(self, start: float | None = None) -> None:
        self._t = time.time() if start is None else start
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        with self._lock:
            return self._t

    def advance(self, dt: float) -> None:
        with self._lock:
            self._t += dt

    def sleep(self, dt: float) -> None:
        self.sleeps.append(dt)
        self.advance(dt)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metric_service(clock: FakeClock) -> Iterator[LocalMetricService]:
    svc = LocalMetricService(clock=clock).start()
    try:
        yield svc
    finally:
        svc.stop()
