"""Validate the fleet simulator against a measured run: same config, same event schedule.

    python -m bench.sim_validation RUN_DIR [--json]
    python -m bench.sim_validation --measure [--work DIR] [--json]

``--measure`` first makes the measured run: the default job on the local emulated cluster
(500 steps, a save every 20, 2 spare slices) with two preemption notices published through
``python -m orchestrator.events publish``, 25 s into each RUNNING; it takes the machine for
~2 minutes and records the 1-minute load before and after (a figure taken under load is not a
result).

``RUN_DIR`` is the run directory of a real orchestrated run on the local cluster, e.g. the
orchestrator's run of figure 4 (``python -m bench --full --set only_goodput=true``; the run
dirs stay under the printed ``scratch:`` directory). The simulator is *calibrated* from that
run's own records (FORMING / RESTORING / COMPILING durations from timeline.jsonl, the cold
first formation apart from the re-forms; seconds per step while RUNNING; blocking
save time from metrics.jsonl, drain-save time from CHECKPOINTING), given the
run's resolved ``controller`` config and topology (config.yaml), and *replays* the run's
events.jsonl as its trace, over the run's wall time. Both goodputs are the project's timeline
goodput (``orchestrator.metrics.goodput``); the issue's target is |sim - measured| <= 0.05.

The calibration is unit-tested on run directories the simulator itself writes
(tests/sim/test_validation.py); the measured comparison is a bench figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.metrics.rundir import load_run
from orchestrator.shared import configtools
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.files import read_jsonl
from orchestrator.sim.config import SimConfig
from orchestrator.sim.runner import simulate

TARGET_POINTS = 0.05


def _lines(path: Path) -> list[dict[str, Any]]:
    return list(read_jsonl(path))  # a torn last line of a killed driver is skipped


def _median(xs: list[float], default: float) -> float:
    return statistics.median(xs) if xs else default


def _running_step_s(timeline: list[dict[str, Any]], blocking_s: float) -> float | None:
    """Seconds per step while RUNNING, from the timeline: RUNNING wall time less the blocking
    part of the saves made in it, over the steps it advanced. Unlike the median step time it
    carries what every step pays on average (chunk boundaries, a group's slower first steps),
    so the simulated run is where the real one was when each replayed event arrives."""
    running_s, steps, entered = 0.0, 0, None
    for r in timeline:
        if r.get("prev") == "RUNNING" and entered is not None:
            running_s += float(r.get("prev_duration_s") or 0.0)
            steps += max(0, int(r.get("step") or 0) - entered)
        entered = int(r.get("step") or 0) if r.get("state") == "RUNNING" else None
    if steps <= 0 or running_s <= blocking_s:
        return None
    return (running_s - blocking_s) / steps


def _reform(phases: dict[str, list[float]], commit: float) -> dict[str, Any]:
    """Re-form costs, the run's cold first formation apart from its re-forms.

    The first RESTORING has no checkpoint to read: it initializes the train state (the init
    program's compile and run), so it calibrates ``fresh_start_s``. The first COMPILING is
    the cold compile (or a load, when the executable store already held the step); re-forms
    of a mesh size seen before load the stored executable, so their median calibrates
    ``compile_cached_s``. Medians over all formations would hide the cold start, which is a
    large share of a short run's wall time."""
    restoring, compiling = phases.get("RESTORING", []), phases.get("COMPILING", [])
    out: dict[str, Any] = {
        "forming_s": _median(phases.get("FORMING", []), 4.0),
        # the tier's latency is added back to every restore by the cost model
        "restore_base_s": max(0.0, _median(restoring[1:], 1.0) - commit),
        "compiling_s": compiling[0] if compiling else 6.0,
        "detect_s": 0.1, "jitter": 0.0}
    if restoring:
        out["fresh_start_s"] = restoring[0]
    if len(compiling) > 1:
        out["compile_cached_s"] = _median(compiling[1:], 0.2)
    return out


def calibrate(run_dir: Path) -> dict[str, Any]:
    """Sim config data (for ``configtools.build(SimConfig, ...)``) from a run's records."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise OrchestratorError(f"{cfg_path} is missing",
                                fix="pass the run directory of an orchestrator.main run")
    rc = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    timeline = _lines(run_dir / "timeline.jsonl")
    if len(timeline) < 2:
        raise OrchestratorError(f"{run_dir}/timeline.jsonl has no transitions",
                                fix="pass the run directory of a run that started")
    phases: dict[str, list[float]] = {}
    for r in timeline:
        if r.get("prev"):
            phases.setdefault(r["prev"], []).append(float(r.get("prev_duration_s") or 0.0))
    metrics = _lines(run_dir / "metrics.jsonl")
    steps = [float(m["step_time_s"]) for m in metrics[5:] if m.get("step_time_s")]
    if not steps and (run_dir / "summary.json").exists():
        median = json.loads((run_dir / "summary.json").read_text()).get("median_step_s")
        steps = [float(median)] if median else []
    blocking = [float(m["checkpoint_blocking_s"]) for m in metrics
                if m.get("checkpoint_blocking_s")]
    block = _median(blocking, 0.0)
    commit = max(0.0, _median(phases.get("CHECKPOINTING", []), block) - block)
    em = rc.get("cluster", {}).get("emulate", {})
    controller = dict(rc.get("controller") or {})
    controller.pop("chaos", None)
    events = [e for e in _lines(run_dir / "events.jsonl") if "event" in e]
    t0 = float(timeline[0]["at"])
    data: dict[str, Any] = {
        "name": "validate", "seed": 0,
        "horizon_h": (float(timeline[-1]["at"]) - t0) / 3600.0,
        "total_steps": int(rc.get("run", {}).get("total_steps", 0)),
        "topology": {"slices": int(em.get("slices", 1)),
                     "hosts_per_slice": int(em.get("hosts_per_slice", 2)),
                     "devices_per_host": int(em.get("devices_per_host", 2)),
                     "spare_slices": int(em.get("spare_slices", 0))},
        "step": {"compute_s": _running_step_s(timeline, sum(blocking))
                 or _median(steps, 0.5)},
        "checkpoint": {"state_gb": 0, "tier": "gcs", "tiers": {"gcs": {
            "blocking_s": block, "latency_s": commit,
            "write_gbps": 1e6, "read_gbps": 1e6}}},
        "reform": _reform(phases, commit),
        "capacity": {"host_repair": {"kind": "fixed", "mean_s": 0},
                     "slice_return": {"kind": "fixed", "mean_s": 0}},
        "controller": controller,
    }
    if events:
        first = min(float(e["event"].get("observed_at") or e["at"]) for e in events)
        data["trace"] = {"path": str(run_dir / "events.jsonl"),
                         "start_offset_s": max(0.0, first - t0)}
    return data


def compare(run_dir: Path, *, work: Path | None = None) -> dict[str, Any]:
    """Measured vs simulated timeline goodput for the run in ``run_dir``."""
    run_dir = Path(run_dir)
    data = calibrate(run_dir)
    cfg = configtools.build(SimConfig, data)
    timeline = _lines(run_dir / "timeline.jsonl")
    measured = load_run(run_dir, now=float(timeline[-1]["at"])).goodput
    sim = simulate(cfg, run_dir=work)
    diff = sim.goodput - measured.goodput
    return {"run_dir": str(run_dir), "measured_goodput": measured.goodput,
            "simulated_goodput": sim.goodput, "difference": diff,
            "within_target": abs(diff) <= TARGET_POINTS, "target": TARGET_POINTS,
            "measured_badput_s": {k: v for k, v in measured.badput_s.items() if v > 0},
            "simulated_badput_s": sim.badput_s, "calibration": data,
            "simulated_end": f"{sim.state}: {sim.reason}"}


def _running_count(run_dir: Path) -> int:
    return sum(1 for r in _lines(run_dir / "timeline.jsonl") if r.get("state") == "RUNNING")


def _wait_running(run_dir: Path, count: int, driver: subprocess.Popen, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while _running_count(run_dir) < count:
        if driver.poll() is not None or time.monotonic() > end:
            raise OrchestratorError(
                f"the measured run did not reach RUNNING #{count} (driver rc={driver.poll()})",
                fix=f"read {run_dir.parent}/driver.log")
        time.sleep(0.5)


def measure(work: Path, *, preemptions: int = 2, gap_s: float = 25.0) -> Path:
    """Make the measured run (see the module doc); returns its run directory."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "run"
    py = sys.executable
    cmd = [py, "-m", "orchestrator.main", f"run.run_dir={run_dir}", "run.name=simval",
           "run.total_steps=500", "cluster.emulate.spare_slices=2",
           "controller.checkpoint_interval.every_steps=20", "events.metadata.enabled=off"]
    with (work / "driver.log").open("w") as log:
        driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_running(run_dir, 1, driver, 300)
            for n in range(1, preemptions + 1):
                time.sleep(gap_s)
                subprocess.run([py, "-m", "orchestrator.events", "publish", "--run-dir",
                                str(run_dir), "--kind", "preemption", "--host", "1",
                                "--deadline-s", "30"], check=True, capture_output=True)
                _wait_running(run_dir, n + 1, driver, 120)
            if driver.wait(timeout=600) != 0:
                raise OrchestratorError(f"the measured run failed (rc={driver.returncode})",
                                        fix=f"read {work}/driver.log")
        finally:
            if driver.poll() is None:
                driver.terminate()
                driver.wait(timeout=60)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim_validation", description=__doc__)
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--measure", action="store_true", help="make the measured run first")
    p.add_argument("--work", default=None, help="where --measure writes (default: a new "
                   "directory under the system temp dir)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if bool(args.run_dir) == args.measure:
        p.error("pass a RUN_DIR or --measure (one of them)")
    load: dict[str, float] = {}
    try:
        if args.measure:
            work = Path(args.work or tempfile.mkdtemp(prefix="simval-"))
            load["before"] = os.getloadavg()[0]
            run_dir = measure(work)
            load["after"] = os.getloadavg()[0]
        else:
            run_dir = Path(args.run_dir)
        out = compare(run_dir)
    except OrchestratorError as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2
    if load:
        out["load_1min"] = load
        print(f"measured run: {run_dir} (1-minute load {load['before']:.2f} before, "
              f"{load['after']:.2f} after)", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(f"measured goodput {out['measured_goodput']:.3f}, simulated "
              f"{out['simulated_goodput']:.3f}, difference {out['difference']:+.3f} "
              f"(target within {TARGET_POINTS}): "
              f"{'MET' if out['within_target'] else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
