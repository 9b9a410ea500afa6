"""The printed table: one line per figure, value with spread, target, and what it is made of."""

from __future__ import annotations

from bench.stats import fmt, fmt_spread


def _validity_line(v: dict | None) -> str:
    if not v or v.get("valid") is None:
        return "validity: no per-measurement load recorded (older result)"
    if v["valid"]:
        return (f"validity: idle machine, 1-minute load <= {v['max_load_1min_before']:.2f} before "
                f"every measurement (threshold {v['threshold']})")
    busy = "; ".join(v["busy"]) or "no load recorded"
    return (f"validity: NOT A RESULT, the machine was busy ({busy}; threshold "
            f"{v['threshold']}): re-run on an idle machine")


def render(result: dict) -> str:
    f = result["figures"]
    m = result["machine"]
    lines = [
        f"tpu-orchestrator benchmarks ({result['mode']} mode, {result['duration_s']} s)",
        f"machine: {m['nproc']} cores ({m['cpu_model']}), {m['mem_total_gib']} GiB, load "
        f"{m['load_average_1_5_15']} -> {result['load_average_after']}, python {m['python']}, "
        f"ray {m['versions'].get('ray')}, jax {m['versions'].get('jax')}, "
        f"orbax {m['versions'].get('orbax-checkpoint')}",
        _validity_line(result.get("validity")),
        "",
        f"{'figure':<44} {'value  median [min–max] (n)':<44} target",
        "-" * 100,
    ]

    def row(name: str, value: str, target: str = "") -> None:
        lines.append(f"{name:<44} {value:<44} {target}")

    o = f["1_steady_state_overhead"]
    row("1 overhead: step time orch/bare", fmt(o.get("ratio_step_time")), "<= 1.02")
    row("  per-repeat ratio", fmt_spread(o["ratio_step_time_per_repeat"]))
    row("  orchestrated step s", fmt_spread(o["orchestrated_step_s"]))
    row("  bare step s", fmt_spread(o["bare_step_s"]))
    row("  wall per step orch/bare", fmt(o.get("ratio_wall_per_step")))
    if "orchestrated_outside_steps_share" in o:
        row("  wall share outside steps: orch", fmt_spread(o["orchestrated_outside_steps_share"]))
        row("  wall share outside steps: bare", fmt_spread(o["bare_outside_steps_share"]))
    a = f["2_announced_preemption"]
    row("2 announced: steps lost", str(a["steps_lost"]), "0")
    row("  notice -> checkpoint committed s", fmt_spread(a["notice_to_committed_s"]))
    row("  notice -> first productive step s", fmt_spread(a["notice_to_first_step_s"]),
        "<= 3 (warm standby)")
    for k, v in a["phases_s"].items():
        row(f"    phase {k} s", fmt_spread(v))
    r = f["3_recovery_vs_full_restart"]
    row("3 to first step: orch/full restart", fmt(r.get("ratio")), "<= 0.25")
    row("  orchestrator s", fmt_spread(r["orchestrator_s"]))
    row("  full restart s", fmt_spread(r["full_restart_s"]))
    row("  steps lost orch | restart",
        f"{r['steps_lost_orchestrator']} | {r['steps_lost_full_restart']}")
    g = f["4_goodput_under_preemptions"]
    row("4 goodput", g.get("mode", "")[:44],
        ">= 0.90 (one per 100 s), >= 0.95 (per 5 min); +15 points")
    for name, s in (g.get("systems") or {}).items():
        gp = s.get("goodput")
        value = fmt_spread(gp) if isinstance(gp, dict) else fmt(gp)
        row(f"  {name} goodput", value)
        if isinstance(s.get("useful_step_time_share"), float):
            row(f"  {name} time in useful steps", fmt(s["useful_step_time_share"]))
        row(f"  {name} wall s | steps lost",
            f"{fmt_spread(s['wall_s']) if isinstance(s['wall_s'], dict) else fmt(s['wall_s'])}"
            f" | {s.get('steps_lost')}")
        if s.get("useful_steps") is not None and s.get("step_s"):
            row(f"  {name} useful | step s",
                f"{s['useful_steps']} | {fmt(s['step_s'])}")
    c = f["5_checkpoint_inflation"]
    row("5 checkpoint: step during save/without", fmt(c.get("ratio")))
    row("  during-save step s", fmt_spread(c["during_save_step_s"]))
    row("  without-save step s", fmt_spread(c["without_save_step_s"]))
    row("  save blocking s", fmt_spread(c["save_blocking_s"]))
    if result.get("errors"):
        lines.append("errors: " + "; ".join(result["errors"]))
    return "\n".join(lines)
