"""Validate the fleet simulator against a measured run: same config, same event schedule.

    python -m bench.sim_validation RUN_DIR [--json]

``RUN_DIR`` is the run directory of a real orchestrated run on the local cluster, e.g. the
orchestrator's run of figure 4 (``python -m bench --full --set only_goodput=true``; the run
dirs stay under the printed ``scratch:`` directory). The simulator is *calibrated* from that
run's own records (median FORMING / RESTORING / COMPILING durations from timeline.jsonl, step
time and blocking save time from metrics.jsonl, drain-save time from CHECKPOINTING), given the
run's resolved ``controller`` config and topology (config.yaml), and *replays* the run's
events.jsonl as its trace, over the run's wall time. Both goodputs are the project's timeline
goodput (``orchestrator.metrics.goodput``); the issue's target is |sim - measured| <= 0.05.

Status: written and unit-tested on run directories the simulator itself writes
(tests/sim/test_validation.py); not yet run against a measured bench run (that needs the Ray
bench, which takes the machine for ~20 minutes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from orchestrator import configtools
from orchestrator.errors import OrchestratorError
from orchestrator.metrics.rundir import load_run
from orchestrator.sim.config import SimConfig
from orchestrator.sim.runner import simulate

TARGET_POINTS = 0.05


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed driver
    return out


def _median(xs: list[float], default: float) -> float:
    return statistics.median(xs) if xs else default


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
        "step": {"compute_s": _median(steps, 0.5)},
        "checkpoint": {"state_gb": 0, "tier": "gcs", "tiers": {"gcs": {
            "blocking_s": block, "latency_s": commit,
            "write_gbps": 1e6, "read_gbps": 1e6}}},
        "reform": {"forming_s": _median(phases.get("FORMING", []), 4.0),
                   # the first restore reads nothing (a fresh start); the tier's latency is
                   # added back to every restore by the cost model
                   "restore_base_s": max(0.0, _median(phases.get("RESTORING", [])[1:], 1.0)
                                         - commit),
                   "compiling_s": _median(phases.get("COMPILING", []), 6.0),
                   "detect_s": 0.1, "jitter": 0.0},
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim_validation", description=__doc__)
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        out = compare(Path(args.run_dir))
    except OrchestratorError as exc:
        print(f"bad input: {exc}", file=sys.stderr)
        return 2
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
