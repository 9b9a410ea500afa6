"""One simulated run: the real ``Controller`` on the simulated seam, and what came out of it.

Wiring: the production ``RunConfig`` (its ``controller`` section is the sim config's), the real
``Lifecycle`` (timeline.jsonl in the run directory), the real ``EventIntake`` (events.jsonl;
no inbox, no Pub/Sub, no metadata), the real policies. The world supplies the ``Clock``,
``ClusterView`` and ``WorkerGroup``. Goodput is the project's own timeline goodput
(``orchestrator.metrics.goodput``) over the simulated window.
"""

from __future__ import annotations

import bisect
import logging
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml

from orchestrator.config import RunConfig
from orchestrator.controller import Controller
from orchestrator.controller.summary import write_summary
from orchestrator.events.intake import EventIntake
from orchestrator.metrics.goodput import compute_goodput
from orchestrator.shared import configtools
from orchestrator.shared.files import atomic_write_text
from orchestrator.sim import models
from orchestrator.sim.cluster import SimCluster, slice_names
from orchestrator.sim.config import SimConfig
from orchestrator.sim.group import SimFleet
from orchestrator.sim.processes import Actor, Happening, generate
from orchestrator.sim.trace import happenings as trace_happenings
from orchestrator.sim.trace import read_trace
from orchestrator.sim.world import HorizonReached, Probe, SimClock, World

POLL_S = 30.0  # the group returns at once when the world delivers something


def run_config(cfg: SimConfig, run_dir: Path | str) -> RunConfig:
    """The production config for the simulated job (validated like ``load_config``)."""
    t = cfg.topology
    step = models.step_s(cfg, t.slices)
    data: dict[str, Any] = {
        "run": {"name": cfg.name, "run_dir": str(run_dir), "seed": cfg.seed,
                "total_steps": cfg.total_steps or 10 ** 12, "steps_per_call": 10 ** 9},
        "cluster": {"mode": "emulate", "emulate": {
            "slices": t.slices, "hosts_per_slice": t.hosts_per_slice,
            "devices_per_host": t.devices_per_host, "spare_slices": t.spare_slices}},
        "train": {"global_batch": t.hosts * t.devices_per_host},
        "timeouts": {"step_s": max(60.0, 10.0 * step)},
        "events": {"inbox": False, "metadata": {"enabled": "off"}},
        "controller": cfg.controller,
    }
    rc = configtools.build(RunConfig, data)
    rc.validate_for(slices=t.slices, hosts_per_slice=t.hosts_per_slice,
                    devices_per_host=t.devices_per_host)
    return rc


@contextmanager
def quiet_logs(level: int = logging.ERROR) -> Iterator[None]:
    """The controller logs every transition; a simulated week would print tens of thousands."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
    try:
        yield
    finally:
        structlog.configure(**old)


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"count": 0}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] * 1000.0

    return {"count": len(s), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": s[-1] * 1000.0,
            "mean_ms": sum(s) / len(s) * 1000.0}


@dataclass
class SimResult:
    name: str
    seed: int
    slices: int
    hosts: int
    spare_slices: int
    state: str
    reason: str
    simulated_s: float
    wall_s: float
    goodput: float
    productive_s: float
    badput_s: dict[str, float]
    lost_steps: int
    steps: int
    last_committed_step: int | None
    time_in_state_s: dict[str, float]
    recoveries: dict[str, dict[str, float]]
    restarts: dict[str, int]
    happenings: dict[str, int]
    decision: dict[str, Any]
    model: dict[str, float] = field(default_factory=dict)
    run_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _recoveries(recs: list[dict], running_at: list[float]) -> dict[str, dict[str, float]]:
    """Recoveries by kind and cause. ``mean_to_running_s``: from the notice or failure to the
    next RUNNING transition (the ledger's own ``to_first_step_s`` ends at the first *chunk*
    after the restore, and the simulator's chunks run to the next save step)."""
    out: dict[str, list[dict]] = {}
    for r in recs:
        out.setdefault(f"{r.get('kind')}:{r.get('cause')}", []).append(r)

    def to_running(r: dict) -> float:
        start = float(r.get("boundary_at") or r["started_at"])
        i = bisect.bisect_left(running_at, start)
        return (running_at[i] - float(r["started_at"])) if i < len(running_at) else 0.0

    return {k: {"count": len(v),
                "mean_to_running_s": sum(to_running(r) for r in v) / len(v),
                "further_failures": sum(len(r.get("further_failures", ())) for r in v),
                "lost_steps": sum(r.get("lost_steps", 0) for r in v)}
            for k, v in sorted(out.items())}


def simulate(cfg: SimConfig, *, run_dir: Path | str | None = None,
             extra: list[Happening] | None = None, time_decisions: bool = True,
             quiet: bool = True) -> SimResult:
    """Run the controller over the configured world until the horizon (or the run's end)."""
    if run_dir is None:
        with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
            result = simulate(cfg, run_dir=tmp, extra=extra, time_decisions=time_decisions,
                              quiet=quiet)
        result.run_dir = ""  # deleted with the temporary directory
        return result
    run_dir = Path(run_dir)
    rc = run_config(cfg, run_dir)
    t = cfg.topology
    names = slice_names(t.slices + t.spare_slices)
    happenings = generate(cfg, len(names)) + list(extra or [])
    if cfg.trace.path:
        happenings += trace_happenings(read_trace(cfg.trace.path), cfg, len(names))
    world = World(horizon_s=cfg.horizon_h * 3600.0)
    probe = Probe(enabled=time_decisions)
    cluster = SimCluster(names, t.hosts_per_slice, t.devices_per_host)
    fleet = SimFleet(cfg, world, cluster, probe,
                     models.Costs(cfg, random.Random(f"{cfg.seed}:costs")))
    clock = SimClock(world, probe)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(rc.as_dict(), sort_keys=False))
    atomic_write_text(run_dir / "sim.yaml", yaml.safe_dump(configtools.to_dict(cfg),
                                                           sort_keys=False))
    intake = EventIntake(rc.events, run_dir=run_dir, job=rc.run.name, clock=clock.now)
    actor = Actor(cfg, world, cluster, job=rc.run.name,
                  submit=lambda p: intake.submit(p, source="sim"), delivered=fleet.delivered,
                  mesh_slices=lambda: list(fleet.current.spec.plan.slice_names)
                  if fleet.current else [])
    actor.install(sorted(happenings, key=lambda h: h.t))
    t0 = time.perf_counter()
    with quiet_logs() if quiet else _nothing():
        intake.start()
        try:
            ctl = Controller(rc, run_dir=run_dir, cluster=cluster, make_group=fleet,
                             clock=clock, intake=intake, poll_interval_s=POLL_S)
            try:
                summary = ctl.run()
            except HorizonReached:
                summary = write_summary(ctl.run_state, "simulation horizon reached")
        finally:
            intake.close()
    wall = time.perf_counter() - t0
    rows = [{**tr.to_json(), "slices": []} for tr in ctl.lifecycle.timeline]
    report = compute_goodput(rows, fleet.spans, now=world.t, samples=2)
    yd_c = models.save_blocking_s(cfg, t.hosts)
    return SimResult(
        name=cfg.name, seed=cfg.seed, slices=t.slices, hosts=t.hosts,
        spare_slices=t.spare_slices, state=summary.state, reason=summary.reason,
        simulated_s=world.t - world.start, wall_s=wall, goodput=report.goodput,
        productive_s=report.productive_s,
        badput_s={k: v for k, v in report.badput_s.items() if v > 0},
        lost_steps=report.lost_steps, steps=summary.step,
        last_committed_step=summary.last_committed_step,
        time_in_state_s=summary.phases_s,
        recoveries=_recoveries(summary.recoveries, [
            r["at"] for r in rows if r["state"] == "RUNNING"]),
        restarts=summary.restarts, happenings=dict(sorted(actor.counts.items())),
        decision={**_stats(probe.decisions), "controller_s": sum(probe.decisions),
                  "simulator_s": probe.seam_s,
                  "by_event": {k: _stats(v) for k, v in sorted(probe.by_event.items())},
                  "by_step": {k: _stats(v) for k, v in sorted(probe.by_step.items())}},
        model={"step_s": models.step_s(cfg, t.slices),
               "save_blocking_s": yd_c,
               "save_commit_s": models.save_commit_s(cfg, t.hosts),
               "restore_s": models.restore_s(cfg, t.hosts)},
        run_dir=str(run_dir))


@contextmanager
def _nothing() -> Iterator[None]:
    yield
