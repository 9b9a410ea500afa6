"""Build a Controller on the fake seam: real config, lifecycle, policies and event intake;
virtual clock, cluster and worker group."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import load_config
from orchestrator.controller import Controller, RunSummary
from orchestrator.controller.config import Policies
from orchestrator.controller.listener import RunListener
from orchestrator.events.intake import EventIntake
from tests.controller.fakes import FakeClock, FakeCluster, FakeFleet

BASE = [
    "run.total_steps=20", "run.steps_per_call=5", "cluster.mode=emulate",
    "cluster.emulate.slices=1", "cluster.emulate.hosts_per_slice=2",
    "cluster.emulate.devices_per_host=2", "controller.checkpoint_interval.every_steps=5",
    "controller.backoff.base_s=0.5", "controller.backoff.max_s=1",
    "controller.max_wait_for_capacity_s=30", "events.inbox=false",
    "events.metadata.enabled='off'", "timeouts.step_s=2",
]


@dataclass
class Sim:
    controller: Controller
    clock: FakeClock
    cluster: FakeCluster
    fleet: FakeFleet
    intake: EventIntake
    run_dir: Path

    def run(self) -> RunSummary:
        try:
            return self.controller.run()
        finally:
            self.intake.close()

    def states(self) -> list[str]:
        return [t.state.value for t in self.controller.lifecycle.timeline]

    def edges(self) -> set[tuple[str, str]]:
        return {(t.prev.value, t.state.value) for t in self.controller.lifecycle.timeline
                if t.prev is not None}

    def payloads(self, state: str) -> list:
        return [t.payload for t in self.controller.lifecycle.timeline if t.state.value == state]

    def events(self) -> list[dict]:
        path = self.run_dir / "events.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def notice(self, kind: str = "preemption_notice", *, host: str | None = None,
               deadline_in: float | None = 60.0, id: str | None = None, **extra) -> None:
        target = {"job": "default"}
        if host is not None:
            target["host"] = host
        payload = {"schema_version": 1, "kind": kind, "target": target, "source": "test",
                   "id": id or f"{kind}-{host}-{self.clock.now()}", **extra}
        if deadline_in is not None:
            payload["deadline"] = self.clock.now() + deadline_in
        self.intake.submit(payload, source="test")


def make(tmp_path: Path, *overrides: str, slices=("s0",), spare=(), commit_after: int = 0,
         step_s: float = 0.1, policies: Policies | None = None,
         listeners: Sequence[RunListener] | None = None) -> Sim:
    """``policies`` / ``listeners``: passed to the Controller (None: from the config)."""
    cfg = load_config(None, [*BASE, *overrides])
    clock = FakeClock()
    cluster = FakeCluster(slices=(*slices, *spare))
    fleet = FakeFleet(clock, cluster, step_s=step_s, commit_after=commit_after)
    run_dir = tmp_path / "run"
    intake = EventIntake(cfg.events, run_dir=run_dir, job=cfg.run.name, clock=clock.now)
    intake.start()
    ctl = Controller(cfg, run_dir=run_dir, cluster=cluster, make_group=fleet, clock=clock,
                     intake=intake, policies=policies, listeners=listeners,
                     poll_interval_s=0.05)
    return Sim(ctl, clock, cluster, fleet, intake, run_dir)


def lose_slice_then_add_one(sim: Sim, *, lose_at: int = 8, add_at: int = 23) -> None:
    """Slice s1 (host s1-h0, mesh host 2) is lost for good at step ``lose_at``; a new slice s2
    appears at step ``add_at``: the shrink-then-grow schedule of a two-slice run."""
    from tests.controller.fakes import lost

    def lose_slice(g):
        sim.cluster.remove("s1-h0")
        return lost(hosts=(2,), nodes=frozenset({"s1-h0"}))

    sim.fleet.on_step(lose_at, lose_slice)
    sim.fleet.on_step(add_at, lambda g: sim.cluster.add_slice("s2"))
