"""Warm re-forms, side by side in one run: what an announced preemption and a kill -9 cost with
cold processes (every re-form starts new ones) and with warm ones (survivors re-initialised in
process, a standby on the spare slice).

``python -m bench.warm [--repeats N]``. Each repeat runs, one after another (interleaved, so
load drift hits every system), ``python -m orchestrator.main`` on its own emulated cluster of
two 1-host slices plus one spare slice (2 CPU devices each, the default tiny model), the RAM
tier on (restores read it), a durable save every 10 steps:

| system | ``controller.warm`` | event at step 25 on host 1 |
|---|---|---|
| notice-cold | reuse_processes=off, standby_slices=0 | preemption notice, 30 s deadline |
| notice-warm | reuse_processes=on, standby_slices=1 | the same |
| kill-cold | reuse_processes=off, standby_slices=0 | kill -9 before the step after 25 |
| kill-warm | reuse_processes=on, standby_slices=1 | the same |
| steady | reuse_processes=off, standby_slices=0 | none |
| steady-standby | reuse_processes=on, standby_slices=1 | none (a standby idles on the spare) |
| shrink | reuse_processes=on, no spare, ``compile.ahead=false`` | preemption notice at step 80 |
| shrink-ahead | the same, ``compile.ahead=true`` (the 1-slice step compiled ahead) | the same |

And what a user who keeps the defaults gets (issue 32): the **default config** (one slice of two
hosts, the default tiny model) plus one spare slice, nothing else set, beside the same run with
the old defaults written out (``checkpoint.ram.enabled=false``, ``standby_slices=0``):

| system | settings | event at step 25 on host 1 |
|---|---|---|
| notice-default | defaults + ``spare_slices=1`` | preemption notice, 30 s deadline |
| notice-old-default | the same + the old defaults | the same |
| notice-no-preform | the same + ``controller.warm.preform=false`` (standbys only) | the same |
| kill-default | defaults + ``spare_slices=1``, a durable save every 10 steps | kill -9 |
| kill-old-default | the same + the old defaults | the same |

Per run, from ``summary.json``'s recovery: *to first step* (notice or failure seen → first
productive step on the new mesh), *downtime* (announced: the drain's step boundary, the old
mesh's last productive step, → the first productive step on the new mesh), the phases, steps
lost and how the new group got its processes; for every run the median step time after the
first 5 steps (60 for ``steady-standby`` / ``steady``, 160-step runs: what an idle standby
costs a step, once its own start-up is over). Output: a
table on stdout and ``bench/results/warm-<time>.json``; a run started at a 1-minute load >= 1.5
makes the whole run NOT A RESULT.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench import machine
from bench.orchestrated import run_main
from bench.sidebyside import interleave, write_result
from bench.stats import fmt_spread, spread

TOPOLOGY = ["cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1",
            "cluster.emulate.devices_per_host=2", "cluster.emulate.spare_slices=1",
            "checkpoint.ram.enabled=true", "controller.checkpoint_interval.every_steps=10",
            "metrics.console_every_steps=0", "run.total_steps=60"]
COLD = ["controller.warm.reuse_processes=off", "controller.warm.standby_slices=0"]
WARM = ["controller.warm.reuse_processes=on", "controller.warm.standby_slices=1"]
NOTICE = "controller.chaos=[{at_step: 25, host: 1, kind: preempt, deadline_s: 30}]"
KILL = "controller.chaos=[{at_step: 25, host: 1, kind: kill}]"
SHRINK = ["cluster.emulate.spare_slices=0", "controller.warm.reuse_processes=on",
          "controller.warm.standby_slices=0", "run.total_steps=120",
          "controller.chaos=[{at_step: 80, host: 1, kind: preempt, deadline_s: 30}]"]
"""No spare: the notice shrinks the run to slice 0 (its process re-initialised in process). At
step 80 the compile ahead (~2-4 s after the first step) is long done, as for a notice that comes
any time after a group's first seconds; one that comes sooner waits for it (tests/faults)."""
DEFAULTS = ["cluster.emulate.spare_slices=1", "metrics.console_every_steps=0",
            "run.total_steps=60"]
"""The default config plus one spare slice: what a user who keeps the defaults runs."""
OLD_DEFAULTS = ["checkpoint.ram.enabled=false", "controller.warm.standby_slices=0"]
EVERY_10 = "controller.checkpoint_interval.every_steps=10"
DEFAULT_SYSTEMS = {"notice-default": [NOTICE], "notice-old-default": [*OLD_DEFAULTS, NOTICE],
                   "notice-no-preform": ["controller.warm.preform=false", NOTICE],
                   "kill-default": [EVERY_10, KILL],
                   "kill-old-default": [*OLD_DEFAULTS, EVERY_10, KILL]}
SYSTEMS = {"notice-cold": [*COLD, NOTICE], "notice-warm": [*WARM, NOTICE],
           "kill-cold": [*COLD, KILL], "kill-warm": [*WARM, KILL],
           "steady": [*COLD, "run.total_steps=160"],
           "steady-standby": [*WARM, "run.total_steps=160"],
           "shrink": [*SHRINK, "compile.ahead=false"],
           "shrink-ahead": [*SHRINK, "compile.ahead=true"],
           **{k: [*DEFAULTS, *v] for k, v in DEFAULT_SYSTEMS.items()}}
STEADY_FROM = 60
"""Steady systems' median step time counts steps after this one: the standby's own start-up
(imports, ~3 s of CPU) overlaps the first steps and is not what an idle standby costs."""


def measure(system: str, run_dir: Path, *, timeout_s: float) -> dict:
    before = machine.load_average()
    t0 = time.time()
    base = [] if system in DEFAULT_SYSTEMS else TOPOLOGY
    code, rd = run_main(run_dir, [*base, f"run.name=warm-{system}", *SYSTEMS[system]],
                        timeout_s=timeout_s)
    s = rd.summary
    rec = (s.get("recoveries") or [{}])[0]
    skip = STEADY_FROM if system.startswith("steady") else 5
    times = [float(m["step_time_s"]) for m in rd.metrics if m.get("step", 0) > skip
             and m.get("step_time_s") is not None]
    first, boundary = rec.get("first_step_at"), rec.get("boundary_at")
    return {"system": system, "exit_code": code, "state": s.get("state"),
            "to_first_step_s": rec.get("to_first_step_s"),
            "downtime_s": round(first - boundary, 3) if first and boundary else None,
            "phases_s": rec.get("phases_s", {}), "processes": rec.get("processes", {}),
            "lost_steps": s.get("lost_steps"), "wall_s": round(time.time() - t0, 1),
            "ram_every": [c.get("every") for c in
                          (s.get("protection") or {}).get("ram_every", [])],
            "median_step_s": round(statistics.median(times), 5) if times else None,
            "load_before": before, "load_after": machine.load_average(), "run_dir": str(run_dir)}


def _stats(xs: list[float | None]) -> dict:
    return spread([x for x in xs if x is not None])


def figures(runs: list[dict]) -> dict:
    out: dict = {}
    for system in SYSTEMS:
        mine = [r for r in runs if r["system"] == system and r["state"] == "SUCCEEDED"]
        phases = sorted({k for r in mine for k in r["phases_s"]})
        out[system] = {"to_first_step_s": _stats([r["to_first_step_s"] for r in mine]),
                       "downtime_s": _stats([r["downtime_s"] for r in mine]),
                       "phases_s": {k: _stats([r["phases_s"].get(k) for r in mine])
                                    for k in phases},
                       "lost_steps": [r["lost_steps"] for r in mine],
                       "median_step_s": _stats([r["median_step_s"] for r in mine]),
                       "processes": [r["processes"] for r in mine],
                       "ram_every": [r.get("ram_every") for r in mine],
                       "failed_runs": sum(r["state"] != "SUCCEEDED" for r in runs
                                          if r["system"] == system)}
    pairs = [(a["median_step_s"], b["median_step_s"]) for a in runs for b in runs
             if a["system"] == "steady-standby" and b["system"] == "steady"
             and a["repeat"] == b["repeat"] and a["median_step_s"] and b["median_step_s"]]
    out["step_ratio_standby_vs_none"] = _stats([a / b for a, b in pairs])
    return out


def render(result: dict) -> str:
    f, v = result["figures"], result["validity"]
    lines = [f"warm re-forms ({'VALID' if v['valid'] else 'NOT A RESULT'}: max 1-minute load "
             f"before a run {v['max_load_1min_before']}, threshold {v['threshold']})", "",
             "| system | to first step (s) | downtime (s) | FORMING (s) | lost | processes |",
             "|---|---|---|---|---|---|"]

    cell = fmt_spread
    for system, x in f.items():
        if system not in SYSTEMS or not (x["lost_steps"] or x["failed_runs"]):
            continue  # not in this run (--systems)
        lines.append(f"| {system} | {cell(x['to_first_step_s'])} | {cell(x['downtime_s'])} | "
                     f"{cell(x['phases_s'].get('FORMING', {}))} | {x['lost_steps']} | "
                     f"{x['processes'][0] if x['processes'] else '-'} |")
    chosen = {k: f[k]["ram_every"] for k in DEFAULT_SYSTEMS if f.get(k, {}).get("ram_every")}
    if chosen:
        lines.append("\nRAM copy interval chosen (checkpoint.ram.every: auto), per run: "
                     + "; ".join(f"{k} {v}" for k, v in chosen.items()))
    if f["step_ratio_standby_vs_none"].get("n"):
        lines.append(f"\nmedian step, standby alive / none (per repeat): "
                     f"{cell(f['step_ratio_standby_vs_none'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    if unknown := sorted(set(systems) - set(SYSTEMS)):
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    runs, loads, started = interleave(
        "warm", systems, args.repeats,
        lambda system, run_dir: measure(system, run_dir, timeout_s=args.timeout_s),
        lambda out: (f"{out['state']} to first step {out['to_first_step_s']} s "
                     f"downtime {out['downtime_s']} s"))
    result = {"machine": machine.describe(), "settings": vars(args), "runs": runs,
              "figures": figures(runs), "validity": machine.validity(loads),
              "seconds": round(time.time() - started, 1)}
    path = write_result("warm", args.out, result)
    print(render(result))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
