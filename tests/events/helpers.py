"""Small builders shared by the event tests."""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.events.intake import EventIntake
from orchestrator.events.model import Event, EventKind, Target
from orchestrator.shared.hosts import HostRef


def hosts(n: int = 2, slice_name: str = "slice-a") -> list[HostRef]:
    return [HostRef(index=i, slice_name=slice_name, worker_id=i, node_id=f"node{i}",
                    node_ip=f"10.0.0.{i + 1}", instance=f"vm-{i}", devices=2) for i in range(n)]


def event(kind: EventKind = EventKind.PREEMPTION_NOTICE, *, host: str | None = "1",
          slice_name: str | None = None, job: str | None = None, id: str = "e1",
          deadline: float | None = None, incarnation: int | None = None,
          observed_at: float = 100.0, labels: dict | None = None) -> Event:
    return Event(kind=kind, target=Target(job=job, slice=slice_name, host=host), source="test",
                 id=id, observed_at=observed_at, deadline=deadline, incarnation=incarnation,
                 labels=labels or {})


def poll_until(intake: EventIntake, hs, incarnation: int = 0, *, count: int = 1,
               timeout_s: float = 10.0) -> list[Event]:
    """Poll until ``count`` events were returned (or the timeout passes)."""
    out: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        intake.wait(0.2)
        out.extend(intake.poll(hs, incarnation))
    return out


def lines(path: Path) -> list[dict]:
    """The file's complete lines: a line the intake is still writing (no newline yet) is left
    for the next read (a poll in a loaded run once read half a dead letter)."""
    import json

    if not path.exists():
        return []
    done = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in done if line.strip()]
