"""Fleet simulator figures and targets (issue 15), from the example configs.

    python -m bench.sim_figures [--quick] [--out DIR] [--measure | --validate-run RUN_DIR]

1. a simulated week of 256 slices x 16 hosts (orchestrator/sim/examples/week-256.yaml): wall
   time (target < 60 s) and controller decision time at 4,096 hosts (target p99 < 100 ms);
2. decision time vs mesh size, 4 -> 4,096 hosts, per controller step (target: none grows
   worse than linearly);
3. goodput vs checkpoint interval in Young/Daly's simple model (young-daly.yaml), the fitted
   optimum against sqrt(2*C*MTBF) (target within 10%);
4. goodput vs spare slices (plan-capacity.yaml);
5. with ``--measure`` (a real run on the local Ray cluster first, ~2 minutes, see
   ``bench/sim_validation.py``) or ``--validate-run RUN_DIR``: simulated against measured
   goodput for the same config and event schedule (target within 5 points).
Writes ``OUT/sim-<time>/`` (CSV, JSON, text plots, PNGs, targets.json) and prints the targets.
Without 5, no Ray and no JAX: about 5 minutes on 2 cores (``--quick``: about 1 minute).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench import sim_validation
from orchestrator.shared.errors import OrchestratorError
from orchestrator.sim import cli
from orchestrator.sim.config import load_sim_config
from orchestrator.sim.report import write_json

EXAMPLES = Path(__file__).resolve().parent.parent / "orchestrator" / "sim" / "examples"


def _validation(out: Path, run_dir: str | None) -> dict:
    """Simulated vs measured goodput; a measured run starts once the figures' load has gone."""
    if run_dir is None:
        end = time.monotonic() + 180
        while os.getloadavg()[0] >= 1.5 and time.monotonic() < end:
            time.sleep(5)
        load = os.getloadavg()
        path = sim_validation.measure(out / "validation")
    else:
        load, path = None, Path(run_dir)
    got = {**sim_validation.compare(path), "load_average_before": load,
           "load_average_after": os.getloadavg() if run_dir is None else None}
    got.pop("calibration")
    write_json(out / "validation.json", got)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim_figures", description=__doc__)
    p.add_argument("--quick", action="store_true", help="shorter horizons, one seed")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    how = p.add_mutually_exclusive_group()
    how.add_argument("--measure", action="store_true",
                     help="make a real run on the local Ray cluster and validate against it")
    how.add_argument("--validate-run", metavar="RUN_DIR", help="validate against this run")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out) / f"sim-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    quick = args.quick
    week = load_sim_config(str(EXAMPLES / "week-256.yaml"))
    yd = load_sim_config(str(EXAMPLES / "young-daly.yaml"))
    plan = load_sim_config(str(EXAMPLES / "plan-capacity.yaml"))
    if quick:
        week, yd, plan = (replace(week, horizon_h=12.0), replace(yd, horizon_h=100.0),
                          replace(plan, horizon_h=24.0))
    load_before = os.getloadavg()
    found = {"run": cli.run_once(week, out / "week", as_json=False),
             "scale": cli.scale_figure(week, out / "scale", horizon_h=6.0 if quick else 24.0),
             "checkpoint": cli.checkpoint_figure(yd, out / "checkpoint",
                                                 seeds=range(1 if quick else 3)),
             "spares": cli.spares_figure(plan, out / "spares", (0, 1, 2, 4, 8))}
    if args.measure or args.validate_run:
        try:
            found["validation"] = _validation(out, args.validate_run)
        except OrchestratorError as exc:
            print(f"validation: {exc}", file=sys.stderr)
            return 2
    targets = cli.evaluate_targets(week, found)
    write_json(out / "targets.json", {"targets": targets, "quick": quick,
                                      "load_average_before": load_before,
                                      "load_average_after": os.getloadavg()})
    print("\n" + cli.format_targets(targets))
    print(f"\nload average before {load_before}, after {os.getloadavg()}; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
