"""The fault matrix: every fault the orchestrator claims to survive, injected one at a time
into ``python -m orchestrator.main`` on its own local emulated cluster, with what followed.

``python -m bench.faults [--only a,b] [--dry-run] [--timeout-s S] [--out DIR]``: a table, one
line per fault: outcome (and whether it is the expected one), steps lost, time to the first
productive step after the fault (failure or notice seen -> first step; for a driver killed or
stopped: the signal -> the resumed run's first step). The rows are ``bench/fault_rows.py``;
one whose fault cannot be injected yet, or whose handling is not in this tree, says "not
implemented yet" instead of a result, and one this machine cannot inject (disk-full needs a
mount namespace: root, or unprivileged user namespaces) says "skipped: needs ...". Output: the
table and ``<out>/faults-<time>.json`` (machine, commit, 1-minute load before each row, per-row
detail); ``--dry-run`` runs nothing and lists what would run. A row started at a 1-minute load
>= 1.5 marks its time NOT A RESULT (the outcome stands).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import machine
from bench.fault_kit import Outcome
from bench.fault_rows import ROWS, Row
from bench.sidebyside import wait_for_idle, write_result


def run_row(row: Row, scratch: Path, *, timeout_s: float, dry_run: bool) -> dict:
    """One row's result (never raises: an error is the row's outcome)."""
    base = {"fault": row.name, "does": row.fault, "expect": row.expect}
    if (why := row.unavailable()) is not None:
        return {**base, "status": "not implemented", "outcome": why}
    if (why := row.skipped()) is not None:
        return {**base, "status": "skipped", "outcome": why}
    if dry_run:
        return {**base, "status": "dry run", "outcome": "would run"}
    assert row.run is not None
    if row.cluster:
        wait_for_idle(max_wait_s=90.0)
    before, t0 = machine.load_average(), time.time()
    try:
        out = row.run(scratch / row.name, timeout_s)
    except Exception as exc:  # the harness itself failed: say so, go on with the next row
        out = Outcome(ok=False, outcome=f"bench error: {type(exc).__name__}: {exc}"[:300],
                      detail={"traceback": traceback.format_exc()[-3000:]})
    return {**base, "status": "ok" if out.ok else "UNEXPECTED", "outcome": out.outcome,
            "lost_steps": out.lost_steps, "to_first_step_s": out.to_first_step_s,
            "wall_s": round(time.time() - t0, 1), "load_before": before,
            "load_after": machine.load_average(), "detail": out.detail}


def _commit() -> str:
    """The commit under test, "+dirty" when tracked files differ from it."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def _cell(v: object) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def render(result: dict) -> str:
    lines = [f"fault matrix ({result['seconds']} s, {result['machine']['nproc']} cores, "
             f"1-minute load at start {result['machine']['load_average_1_5_15'][0]}, commit "
             f"{result.get('commit', 'unknown')})", "",
             "| fault | status | outcome | lost steps | to first step (s) | load before |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        load = r.get("load_before")
        busy = load is not None and load[0] >= machine.IDLE_LOAD_1MIN
        ttf = _cell(r.get("to_first_step_s")) + (" (NOT A RESULT: busy)" if busy else "")
        lines.append(f"| {r['fault']} | {r['status']} | {r['outcome']} | "
                     f"{_cell(r.get('lost_steps'))} | {ttf} | "
                     f"{_cell(load[0] if load else None)} |")
    counts = {s: sum(r["status"] == s for r in result["rows"])
              for s in ("ok", "UNEXPECTED", "skipped", "not implemented", "dry run")}
    lines.append("\n" + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated rows (default: all): "
                   + ", ".join(r.name for r in ROWS))
    p.add_argument("--dry-run", action="store_true", help="run nothing, list what would run")
    p.add_argument("--timeout-s", type=float, default=420.0, help="bound per driver run")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--workdir", default=None, help="scratch dir for run dirs and logs")
    args = p.parse_args(argv)
    wanted = [s for s in args.only.split(",") if s]
    if unknown := sorted(set(wanted) - {r.name for r in ROWS}):
        p.error(f"unknown rows {unknown}; choose from {', '.join(r.name for r in ROWS)}")
    rows = [r for r in ROWS if not wanted or r.name in wanted]
    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="bench-faults-"))
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"scratch: {scratch}", flush=True)
    started, results = time.time(), []
    start_machine, commit = machine.describe(), _commit()
    print(f"commit {commit}, 1-minute load at start "
          f"{start_machine['load_average_1_5_15'][0]}", flush=True)
    loads: list[dict] = []
    for row in rows:
        before = machine.load_average()
        res = run_row(row, scratch, timeout_s=args.timeout_s, dry_run=args.dry_run)
        loads.append({"measurement": row.name, "before": before,
                      "after": machine.load_average()})
        results.append(res)
        print(f"  {row.name}: {res['status']}: {res['outcome']}", flush=True)
    result = {"machine": {**start_machine, "load_average_at_end": machine.load_average()},
              "commit": commit, "settings": vars(args), "rows": results,
              "loads": loads, "validity": machine.validity(loads),
              "seconds": round(time.time() - started, 1)}
    path = write_result("faults", args.out, result)
    print(render(result))
    print(f"\njson: {path}")
    return 0 if all(r["status"] != "UNEXPECTED" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
