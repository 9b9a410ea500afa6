"""SIGTERM drains the run; a second signal (or a first SIGINT) stops it at once.

Kubernetes (pod deletion, node drain) and ``ray job stop`` send SIGTERM and kill the process a
grace period later (``terminationGracePeriodSeconds``, 30 s by default; Ray 2.60's job
supervisor waits ``RAY_JOB_STOP_WAIT_TIME_S``, 3 s by default, read from the head node's
environment, then SIGKILLs the driver and its children). The handler does no work: it records
the signal and returns; the controller reads ``request()`` at its next poll and drains like an
operator stop (save the step it stops at, then end the run with exit code ``EXIT_SIGTERM``).
A signal while no controller runs (``armed`` is False), a second signal, or a SIGINT raise
``KeyboardInterrupt``: the driver unwinds through its teardown at once, as before.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

EXIT_SIGTERM = 128 + signal.SIGTERM  # 143: what a process ended by SIGTERM reports
EXIT_SIGINT = 128 + signal.SIGINT  # 130
RAY_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
RAY_STOP_WAIT_DEFAULT_S = 3.0  # Ray 2.60 job_supervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S


@dataclass(frozen=True)
class StopRequest:
    """A stop signal the driver received: which, when, and how long the platform waits before
    SIGKILL when that is known (under ``ray job submit``: ``RAY_JOB_STOP_WAIT_TIME_S``)."""

    signal: str
    at: float
    grace_s: float | None = None


class StopSignals:
    """The driver's SIGTERM / SIGINT handlers and what they recorded."""

    def __init__(self, *, in_ray_job: bool = False) -> None:
        self.first: int | None = None  # the first stop signal received
        self.at: float | None = None
        self.count = 0
        self.armed = False  # a controller polls ``request()``: SIGTERM may drain
        self.in_ray_job = in_ray_job

    def install(self) -> None:
        """(Re)install the handlers (Ray's in-process head node installs its own SIGTERM one);
        main thread only."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.count += 1
        if self.first is None:
            self.first, self.at = signum, time.time()
        if signum == signal.SIGTERM and self.armed and self.count == 1:
            return  # drain: the controller takes it at its next poll
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    def request(self) -> StopRequest | None:
        """The SIGTERM that asked for a drain, if one came (read by the controller)."""
        if self.first != signal.SIGTERM or self.at is None:
            return None
        return StopRequest(signal="SIGTERM", at=self.at, grace_s=self.grace_s())

    def grace_s(self) -> float | None:
        """Seconds ``ray job stop`` waits before SIGKILL, when this driver is a Ray job (the
        supervisor hands the driver its own environment); None when unknown (Kubernetes)."""
        if not self.in_ray_job:
            return None
        try:
            return float(os.environ.get(RAY_STOP_WAIT_ENV, RAY_STOP_WAIT_DEFAULT_S))
        except ValueError:
            return RAY_STOP_WAIT_DEFAULT_S

    def exit_code(self) -> int:
        """For a driver interrupted outside the run: 128 + the first signal's number."""
        return 128 + (self.first or signal.SIGINT)
