"""Checkpoint tiers, side by side in one run: what a save and the RAM tier cost a step, and what
a kill -9 costs in steps, with and without the RAM tier.

``python -m bench.tiers [--repeats N] [--steps N]``. Each repeat runs, one after another on the
same machine (interleaved, so load drift hits every system), ``python -m orchestrator.main`` on
its own emulated cluster of two 1-host slices (2 CPU devices each, the default tiny model):

| system | RAM tier | periodic durable saves (every 10) | fault |
|---|---|---|---|
| plain | off | none | none |
| ram | on, every step | none | none |
| ram-ab | on in alternate blocks of 10 steps (``bench/ab_blocks.py``) | none | none |
| orbax | off | Orbax, async, from the devices | none |
| ram+copy | on, every step | written from the RAM copies by the holders (idle class) | none |
| kill-orbax | off | Orbax | host 1 kill -9 before step 38 |
| kill-ram | on | from the RAM copies | host 1 kill -9 before step 38 |

A step's cost is ``step_time_s`` (measured on host 0 around the jitted step: slowed by anything
competing for the cores) plus what the step waited for after it (the save's blocking part, or
the RAM copy). "During a save" is the save step and the ``window - 1`` steps after it (an async
save commits in the background for several steps); "without" is every other step after the
warm-up. ``ram-ab`` compares, inside one run, the steps of its on-blocks with those of its
off-blocks (the first step of each block left out: the previous block's last copy is still being
sent then); its ratio is immune to the drift between runs minutes apart that the plain/ram pair
suffers (10-14 % on these 2-core machines, more than the 5 % being measured). Output: a table
on stdout and ``bench/results/tiers-<time>.json``; a measurement started at a 1-minute load
>= 1.5 makes the whole run NOT A RESULT.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import ab_blocks, machine
from bench.orchestrated import RunDir, run_main
from bench.sidebyside import interleave, write_result
from bench.stats import fmt, ratio, spread

SAVE_EVERY = 10
KILL_AT = 37
AB_BLOCK = ab_blocks.BLOCK
# the tier as this figure measures it: a copy every step (auto may choose fewer)
RAM_EVERY_STEP = ["checkpoint.ram.enabled=true", "checkpoint.ram.every=1"]
SYSTEMS: dict[str, list[str]] = {
    "plain": ["controller.checkpoint_interval.every_steps=100000"],
    "ram": ["controller.checkpoint_interval.every_steps=100000", *RAM_EVERY_STEP],
    "ram-ab": ["controller.checkpoint_interval.every_steps=100000", *RAM_EVERY_STEP],
    "orbax": [f"controller.checkpoint_interval.every_steps={SAVE_EVERY}"],
    "ram+copy": [f"controller.checkpoint_interval.every_steps={SAVE_EVERY}", *RAM_EVERY_STEP],
    "kill-orbax": [f"controller.checkpoint_interval.every_steps={SAVE_EVERY}",
                   f"controller.chaos=[{{at_step: {KILL_AT}, host: 1, kind: kill}}]"],
    "kill-ram": [f"controller.checkpoint_interval.every_steps={SAVE_EVERY}",
                 *RAM_EVERY_STEP,
                 f"controller.chaos=[{{at_step: {KILL_AT}, host: 1, kind: kill}}]"],
}
TOPOLOGY = ["cluster.emulate.slices=2", "cluster.emulate.hosts_per_slice=1",
            "cluster.emulate.devices_per_host=2", "events.inbox=false"]


def step_costs(records: Sequence[dict], *, skip: int, save_every: int | None, window: int
               ) -> dict[str, list[float]]:
    """Per-step cost (see module doc) of the first incarnation's steps after ``skip``, split
    into steps during a save window and the others."""
    during, without = [], []
    for r in _first_incarnation(records)[skip:]:
        cost = _cost(r)
        in_window = bool(save_every) and (int(r["step"]) % save_every) < window and \
            int(r["step"]) >= save_every
        (during if in_window else without).append(cost)
    return {"during_save": during, "without_save": without}


def ab_costs(records: Sequence[dict], *, skip: int, block: int) -> dict[str, list[float]]:
    """Per-step cost of a ``ram-ab`` run's first incarnation, split into steps of blocks with
    the RAM tier on (1..block, 2*block+1..3*block, ...) and off; the first step of every block
    and the first ``skip`` steps are left out."""
    on, off = [], []
    for r in _first_incarnation(records):
        step = int(r["step"])
        if step <= skip or (step - 1) % block == 0:
            continue
        (on if ab_blocks.on_block(step, block) else off).append(_cost(r))
    return {"on": on, "off": off}


def _first_incarnation(records: Sequence[dict]) -> list[dict]:
    """The first incarnation's step records, by step (later ones restarted from a restore)."""
    first = min((r.get("incarnation", 1) for r in records), default=1)
    return sorted((r for r in records if r.get("incarnation", 1) == first),
                  key=lambda r: r["step"])


def _cost(r: dict) -> float:
    """A step's time plus what it waited for after it: a save's blocking part or the RAM copy."""
    return float(r["step_time_s"]) + max(float(r.get("checkpoint_blocking_s") or 0.0),
                                         float(r.get("ram_copy_s") or 0.0))


def measure(system: str, run_dir: Path, *, steps: int, timeout_s: float) -> dict:
    name = system.replace('+', '-')
    overrides = [*TOPOLOGY, f"run.total_steps={steps}", f"run.name=tiers-{name}",
                 *SYSTEMS[system]]
    before = machine.load_average()
    t0 = time.time()
    driver = "bench.ab_blocks" if system == "ram-ab" else "orchestrator.main"  # see its doc
    code, rd = run_main(run_dir, overrides, timeout_s=timeout_s, module=driver)
    return summarize(system, code, rd, wall_s=time.time() - t0, load_before=before,
                     load_after=machine.load_average())


def summarize(system: str, code: int, rd: RunDir, *, wall_s: float, load_before, load_after,
              window: int = 5, skip: int = 5) -> dict:
    save_every = SAVE_EVERY if system in ("orbax", "ram+copy") else None
    costs = step_costs(rd.metrics, skip=skip, save_every=save_every, window=window)
    s = rd.summary
    ab = ab_costs(rd.metrics, skip=skip, block=AB_BLOCK) if system == "ram-ab" else None
    extra = {} if ab is None else {"on_s": _median(ab["on"]), "off_s": _median(ab["off"]),
                                   "n_on": len(ab["on"]), "n_off": len(ab["off"])}
    return {**extra, "system": system, "exit_code": code, "state": s.get("state"),
            "steps": s.get("step"), "lost_steps": s.get("lost_steps"),
            "restores": [{k: r.get(k) for k in ("restored_step", "tier", "lost_steps",
                                                "restore_s")} for r in s.get("restores", [])],
            "median_step_cost_s": _median(costs["without_save"] + costs["during_save"]),
            "during_save_s": _median(costs["during_save"]),
            "without_save_s": _median(costs["without_save"]),
            "n_during": len(costs["during_save"]), "n_without": len(costs["without_save"]),
            "ram_copy_s": _median([float(r.get("ram_copy_s") or 0.0) for r in rd.metrics
                                   if r.get("ram_copy_s")]),
            "wall_s": round(wall_s, 1), "load_before": load_before, "load_after": load_after,
            "run_dir": str(rd.path)}


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def figures(runs: list[dict]) -> dict:
    """Ratios per repeat (systems of one repeat ran back to back), then their spread."""
    by_repeat: dict[int, dict[str, dict]] = {}
    for r in runs:
        by_repeat.setdefault(r["repeat"], {})[r["system"]] = r
    ram_ratio, orbax_save, copy_save, lost_orbax, lost_ram, ab = [], [], [], [], [], []
    for rep in by_repeat.values():
        if "plain" in rep and "ram" in rep:
            ram_ratio.append(ratio(rep["ram"]["median_step_cost_s"],
                                   rep["plain"]["median_step_cost_s"]))
        if "ram-ab" in rep:
            ab.append(ratio(rep["ram-ab"].get("on_s"), rep["ram-ab"].get("off_s")))
        if "orbax" in rep:
            orbax_save.append(ratio(rep["orbax"]["during_save_s"], rep["orbax"]["without_save_s"]))
        if "ram+copy" in rep:
            copy_save.append(ratio(rep["ram+copy"]["during_save_s"],
                                   rep["ram+copy"]["without_save_s"]))
        for name, out in (("kill-orbax", lost_orbax), ("kill-ram", lost_ram)):
            if name in rep and rep[name]["lost_steps"] is not None:
                out.append(rep[name]["lost_steps"])
    clean = [x for x in ram_ratio if x is not None]
    return {"ram_every_step_vs_off": spread(clean),
            "ram_on_vs_off_in_one_run": spread([x for x in ab if x is not None]),
            "orbax_step_during_save_vs_without": spread([x for x in orbax_save if x]),
            "from_ram_step_during_save_vs_without": spread([x for x in copy_save if x]),
            "kill_lost_steps_orbax": lost_orbax, "kill_lost_steps_ram": lost_ram}


def render(result: dict) -> str:
    v = result["validity"]
    lines = ["checkpoint tiers (bench/tiers.py)",
             "VALID (1-minute load < 1.5 before every run)" if v["valid"] else
             f"NOT A RESULT: {'; '.join(v['busy']) or 'no load recorded'}", "",
             "| repeat | system | state | steps | lost | restores (step/tier) | median step cost s"
             " | during save s (n) | without s (n) | RAM copy s | load before |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        restores = ", ".join(f"{x['restored_step']}/{x['tier']}" for x in r["restores"][1:])
        lines.append(
            f"| {r['repeat']} | {r['system']} | {r['state']} | {r['steps']} | {r['lost_steps']} "
            f"| {restores or '-'} | {fmt(r['median_step_cost_s'], 4)} | "
            f"{fmt(r['during_save_s'], 4)} ({r['n_during']}) | {fmt(r['without_save_s'], 4)} "
            f"({r['n_without']}) | {fmt(r['ram_copy_s'], 4)} | "
            f"{(r['load_before'] or ['?'])[0]} |")
    f = result["figures"]
    lines += ["", "| figure | median [min-max] (n) | target |", "|---|---|---|"]
    for key, target in (("ram_every_step_vs_off", "<= 1.05"),
                        ("ram_on_vs_off_in_one_run", "<= 1.05"),
                        ("orbax_step_during_save_vs_without", "(today's saves)"),
                        ("from_ram_step_during_save_vs_without", "<= 1.10")):
        s = f[key]
        lines.append(f"| {key} | {fmt(s.get('median'))} [{fmt(s.get('min'))}-"
                     f"{fmt(s.get('max'))}] ({s.get('n')}) | {target} |")
    lines.append(f"| kill -9 lost steps, Orbax only (save every {SAVE_EVERY}) | "
                 f"{f['kill_lost_steps_orbax']} | - |")
    lines.append(f"| kill -9 lost steps, RAM tier every step | {f['kill_lost_steps_ram']} | <= 1 |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if args.steps <= KILL_AT + 5:
        p.error(f"--steps must exceed {KILL_AT + 5} (the kill lands before step {KILL_AT + 1})")
    runs, loads, started = interleave(
        "tiers", systems, args.repeats,
        lambda system, run_dir: measure(system, run_dir, steps=args.steps,
                                        timeout_s=args.timeout_s),
        lambda out: (f"{out['state']} lost {out['lost_steps']} "
                     f"cost {fmt(out['median_step_cost_s'], 4)} s"))
    result = {"machine": machine.describe(), "settings": vars(args), "runs": runs,
              "figures": figures(runs), "validity": machine.validity(loads),
              "seconds": round(time.time() - started, 1)}
    path = write_result("tiers", args.out, result)
    print(render(result))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
