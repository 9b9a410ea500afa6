"""A seeded chaos soak: one long run under a random fault schedule, checked against invariants.

``python -m bench.soak --minutes M --seed S [--out DIR] [--steps N] [--dry-run]``: one
``python -m orchestrator.main`` run (2 slices x 2 hosts and a spare slice that comes back
``replace_after_s`` after it goes, ``elastic.min_slices=2`` so every step runs on the same mesh)
under the chaos plug-in's faults drawn from ``random.Random(seed)`` (``bench/soak_plan.py``),
its driver SIGKILLed or SIGTERMed at random moments and started again with the same command line
(the autoresume path), sometimes with its newest checkpoint corrupted in between. At the end:
the invariants (final parameters equal a fault-free run's bit for bit, SUCCEEDED at
total_steps, a summary per life, every fired fault a recovery, no process left, the lock
released, no temporary checkpoint, RELEASING and FORMING bounded), a table, and
``<out>/soak-<time>.json`` with the history and a ``validity`` record. A failing invariant
prints the seed and the history up to the first life it shows in. Exit 0 when all hold.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bench import machine, procs
from bench.fault_kit import SPARE, Background, chaos, cli
from bench.orchestrated import log_path, read_jsonl
from bench.sidebyside import wait_for_idle, write_result
from bench.soak_plan import (
    Check,
    Life,
    LifePlan,
    Plan,
    classify,
    draw_plan,
    fault_counts,
    first_failing_life,
    from_json,
    history_text,
    pure_checks,
    render,
    state_maxima,
)
from orchestrator.shared import layout

INIT_S = 20.0
MESH = ("cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=2",
        "cluster.emulate.devices_per_host=1")
SOAK = (*MESH, "cluster.emulate.replace_after_s=5", "controller.elastic.min_slices=2",
        "controller.max_wait_for_capacity_s=120", "controller.health.cordon_after=1",
        f"timeouts.init_s={INIT_S:g}", "timeouts.step_s=10",
        "controller.budgets.host_lost=100", "controller.budgets.timeout=100",
        "controller.budgets.hardware_health=100")
"""Beyond fault_kit.BASE: the mesh never changes (a missing slice is waited for, not trained
around), capacity comes back, hangs cost 10 s (a step) or 20 s (an init), and the budgets
outlast a soak's faults."""

STEP_S_GUESS = 0.08
"""Seconds a step of this mesh takes on a 2-core machine (0.075 s measured in a soak):
sizes ``run.total_steps``."""


def steps_for(minutes: float) -> int:
    """A quarter of the soak's time in training steps (the rest goes to recoveries and driver
    starts), a multiple of the checkpoint interval, at least 60."""
    return max(60, int(minutes * 60 * 0.25 / STEP_S_GUESS) // 5 * 5)


def overrides(plan: Plan, *, spare: bool = True, faults: bool = True) -> list[str]:
    out = [*SOAK, f"run.total_steps={plan.total_steps}"]
    if spare:
        out.append(SPARE)
    if faults and plan.faults:
        out.append(chaos(*(f.chaos_entry() for f in plan.faults)))
    return out


# ---- one driver life ------------------------------------------------------------------------


def run_life(run: Path, plan: Plan, lp: LifePlan, index: int, timeout_s: float) -> Life:
    """Start the driver, act on it as ``lp`` says, wait for its end, and record what it did."""
    log, offset = log_path(run), _size(log_path(run))
    life = Life(index=index, plan=lp, started_at=time.time())
    bg = Background.start(run, *overrides(plan))
    try:
        if lp.external == "none":
            life.exit_code = bg.wait(timeout_s)
        else:
            life.exit_code = bg.wait(lp.after_s)
            if life.exit_code is None:
                sig = signal.SIGKILL if lp.external == "sigkill" else signal.SIGTERM
                os.kill(bg.proc.pid, sig)
                life.external_at = time.time()
                life.exit_code = bg.wait(30 if sig == signal.SIGKILL else 180)
        if life.exit_code is None:
            life.note = f"still running after its bound ({timeout_s:.0f} s): killed"
        life.leftovers = bg.leftovers(20.0) if life.exit_code is not None else []
    finally:
        bg.end()
    life.ended_at = time.time()
    _read_life(run, life, plan, log, offset)
    if lp.corrupt_after and life.summary.get("state") != "SUCCEEDED":
        life.corrupted = corrupt_newest(run)
    return life


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _read_life(run: Path, life: Life, plan: Plan, log: Path, offset: int) -> None:
    summary = run / "summary.json"
    life.wrote_summary = summary.exists() and summary.stat().st_mtime >= life.started_at
    if life.wrote_summary:
        s = json.loads(summary.read_text())
        life.summary = {k: s.get(k) for k in ("state", "step", "total_steps", "lost_steps",
                                              "restarts", "recoveries", "restores", "reason",
                                              "exit_code", "stopped_by")}
    life.fired = fired_faults(log, offset, plan)
    life.transitions = [
        {k: t.get(k) for k in ("state", "prev", "at", "prev_duration_s", "step", "reason",
                               "slices")}
        for t in read_jsonl(run / "timeline.jsonl") if float(t.get("at", 0)) >= life.started_at]


def fired_faults(log: Path, offset: int, plan: Plan) -> list[dict]:
    """The driver's chaos_armed and chaos_notice lines written after ``offset``."""
    out: list[dict] = []
    try:
        with log.open("rb") as f:
            f.seek(offset)
            data = f.read().decode(errors="replace")
    except OSError:
        return out
    for line in data.splitlines():
        if "chaos_" not in line:
            continue
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            event = rec.get("event") or rec.get("message")
            if event not in ("chaos_armed", "chaos_notice"):
                continue
            e = {"event": event, "kind": rec.get("kind"), "host": rec.get("host"),
                 "step": rec.get("step"), "at": _epoch(rec)}
            e["soak_kind"] = classify(e, plan)
            out.append(e)
    return out


def _epoch(rec: dict) -> float:
    from datetime import datetime

    stamp = rec.get("time") or rec.get("timestamp")
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def corrupt_newest(run: Path) -> list[str]:
    """Truncate one host's shards of the newest complete step of either disk tier: Orbax's
    ``checkpoints/<step>`` (host 1's, as fault_rows.corrupt_newest) or the RAM tier's durable
    copy ``checkpoints-from-ram/<step>`` (source 1's), whichever is newer."""
    disk = layout.committed_steps(run / "checkpoints")
    copies = sorted(int(p.name) for p in (run / "checkpoints-from-ram").glob("*")
                    if p.name.isdigit() and (p / "COMPLETE").exists())
    if not disk and not copies:
        return []
    if copies and (not disk or copies[-1] > disk[-1]):
        shards = sorted((run / "checkpoints-from-ram" / str(copies[-1])).glob(
            "source-1/data/d/*"))
    else:
        shards = sorted((run / "checkpoints" / str(disk[-1]) / "state").glob(
            "ocdbt.process_1/d/*"))
    for f in shards:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return [str(f.relative_to(run)) for f in shards]


# ---- the end state --------------------------------------------------------------------------


def export(run: Path, to: Path) -> dict:
    done = subprocess.run(procs.python_cmd("orchestrator.export", str(run), "--to", str(to)),
                          cwd=procs.ROOT, env=procs.child_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    if done.returncode != 0:
        return {"error": f"export exit {done.returncode}: {done.stderr[-400:]}"}
    return json.loads((to / "export.json").read_text())


def check_params(soak: Path, ref: Path, scratch: Path, total_steps: int) -> Check:
    a, b = export(soak, scratch / "export-soak"), export(ref, scratch / "export-reference")
    if "error" in a or "error" in b:
        return Check("params_equal", False, f"soak: {a.get('error', 'ok')}; reference: "
                     f"{b.get('error', 'ok')}")
    detail = compare_npz(scratch / "export-soak" / "model.npz",
                         scratch / "export-reference" / "model.npz")
    steps = (a.get("step"), b.get("step"))
    if steps != (total_steps, total_steps):
        return Check("params_equal", False, f"not comparable: exported steps {steps} (soak, "
                     f"reference), both must reach {total_steps}")
    return Check("params_equal", detail.startswith("equal"), f"{detail}; exported steps {steps}")


def compare_npz(x: Path, y: Path) -> str:
    """"equal: N arrays bit for bit", or the first difference."""
    with np.load(x) as a, np.load(y) as b:
        if sorted(a.files) != sorted(b.files):
            return f"different arrays: {sorted(set(a.files) ^ set(b.files))[:5]}"
        for k in sorted(a.files):
            u, v = a[k], b[k]
            if u.dtype != v.dtype or u.shape != v.shape:
                return f"{k}: {u.dtype}{u.shape} vs {v.dtype}{v.shape}"
            if u.tobytes() != v.tobytes():
                diff = np.abs(u.astype(np.float64) - v.astype(np.float64))
                return (f"{k} differs in {int((u != v).sum())} of {u.size} values, max "
                        f"{float(diff.max()):.3g}")
        return f"equal: {len(a.files)} arrays bit for bit"


def check_run_dir(run: Path) -> list[Check]:
    """The lock released; no temporary Orbax directory (``*.orbax-checkpoint-tmp*``) left."""
    lock = run / layout_lock()
    held = False
    if lock.exists():
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            held = True
        finally:
            os.close(fd)
    tmp = sorted(str(p.relative_to(run)) for p in run.glob("checkpoints*/**/*")
                 if "orbax-checkpoint-tmp" in p.name)
    return [Check("lock_released", not held, "held by a live process" if held else "free"),
            Check("no_tmp_checkpoints", not tmp, ", ".join(tmp[:5]) or "none")]


def layout_lock() -> str:
    from orchestrator.driver.lock import LOCK_NAME

    return LOCK_NAME


# ---- the soak ---------------------------------------------------------------------------------


def soak(plan: Plan, scratch: Path, minutes: float) -> tuple[list[Life], list[Check], dict]:
    run = scratch / "soak" / "run"
    deadline = time.monotonic() + minutes * 60 + 60
    lives: list[Life] = []
    for i, lp in enumerate(plan.lives):
        left = deadline - time.monotonic()
        left = max(180.0 if lp.external == "none" else 60.0, left)  # let the last one finish
        life = run_life(run, plan, lp, i, timeout_s=left)
        lives.append(life)
        print(f"  life {i}: {lp.external}"
              f"{'' if life.external_at or lp.external == 'none' else ' (ended first)'}"
              f", exit {life.exit_code}, {life.summary.get('state', 'no summary')} at step "
              f"{life.summary.get('step')}, fired {len(life.fired)}"
              f"{', corrupted newest' if life.corrupted else ''}", flush=True)
        if life.summary.get("state") == "SUCCEEDED" or life.exit_code is None:
            break
        if lp.external == "none":  # the final life ended without success: nothing to resume
            break
    ref = scratch / "reference" / "run"
    code, _ = cli(ref, *overrides(plan, spare=False, faults=False), timeout_s=600)
    print(f"  reference: exit {code}", flush=True)
    checks = [check_params(run, ref, scratch, plan.total_steps), *check_run_dir(run),
              *pure_checks(plan, lives, INIT_S)]
    return lives, checks, {"reference_exit": code}


def recheck(path: Path) -> int:
    result = json.loads(path.read_text())
    plan, lives = from_json(result)
    fresh = pure_checks(plan, lives, INIT_S)
    names = {c.name for c in fresh}
    stored = [Check(**c) for c in result["checks"] if c["name"] not in names]
    checks = [*stored, *fresh]
    result.update(checks=[asdict(c) for c in checks], fault_counts=fault_counts(plan, lives),
                  state_max=state_maxima(lives))
    print(render(result))
    if (first := first_failing_life(checks)) is not None:
        print(f"\nFAILED: seed {plan.seed}; history up to life {first}:")
        print(history_text(lives[: first + 1]))
    return 0 if all(c.ok for c in checks) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None, help="the faults' part of the run")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--steps", type=int, default=None,
                   help=f"run.total_steps (default: from --minutes, {STEP_S_GUESS} s a step)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--workdir", default=None, help="scratch dir for run dirs and logs")
    p.add_argument("--dry-run", action="store_true", help="print the schedule, run nothing")
    p.add_argument("--recheck", default=None, metavar="JSON",
                   help="check a stored soak result's history again (this version's checks "
                        "of the history; the run dir and export checks as stored); runs nothing")
    args = p.parse_args(argv)
    if args.recheck:
        return recheck(Path(args.recheck))
    if args.minutes is None or args.seed is None:
        p.error("--minutes and --seed are required (or --recheck JSON)")
    if args.minutes <= 0:
        p.error("--minutes must be > 0")
    plan = draw_plan(args.seed, args.minutes, args.steps or steps_for(args.minutes))
    print(f"seed {plan.seed}: {plan.total_steps} steps, {len(plan.faults)} faults, "
          f"{len(plan.lives)} planned lives", flush=True)
    for f in plan.faults:
        print(f"  step {f.at_step} host {f.host}: {f.kind}"
              + (f" ({f.deadline_s} s)" if f.deadline_s is not None else ""))
    for i, lp in enumerate(plan.lives):
        print(f"  life {i}: {lp.external}" + (f" after {lp.after_s} s" if lp.after_s else "")
              + (", then corrupt the newest checkpoint" if lp.corrupt_after else ""))
    if args.dry_run:
        return 0
    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="bench-soak-"))
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"scratch: {scratch}", flush=True)
    wait_for_idle(max_wait_s=60.0)
    start_machine, started = machine.describe(), time.time()
    before = machine.load_average()
    lives, checks, extra = soak(plan, scratch, args.minutes)
    loads = [{"measurement": "soak", "before": before, "after": machine.load_average()}]
    result = {"seed": plan.seed, "minutes": args.minutes, "total_steps": plan.total_steps,
              "machine": start_machine, "validity": machine.validity(loads), "loads": loads,
              "scratch": str(scratch), "seconds": round(time.time() - started, 1),
              "overrides": overrides(plan), "plan": asdict(plan), **extra,
              "lives": [x.to_json() for x in lives], "checks": [asdict(c) for c in checks],
              "fault_counts": fault_counts(plan, lives), "state_max": state_maxima(lives)}
    path = write_result("soak", args.out, result)
    print(render(result))
    if (first := first_failing_life(checks)) is not None or not all(c.ok for c in checks):
        upto = first if first is not None else len(lives) - 1
        print(f"\nFAILED: seed {plan.seed}; history up to life {upto}:")
        print(history_text(lives[: upto + 1]))
    print(f"\njson: {path}")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
