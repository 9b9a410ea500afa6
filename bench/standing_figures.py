"""The standing-cluster bench's figures (``bench/standing.py``): each system's goodput under
the schedule beside the same job's undisturbed, their ratio (the relative goodput) in both
measures, and the printed table."""

from __future__ import annotations

from bench.stats import fmt, ratio

SYSTEMS = ("orchestrator", "full_restart", "ray_train")


GOODPUT = ("productive step time / the window: the time of the last run of each useful step "
           "(ml-goodput-measurement's goodput); the median-step goodput counts each useful step "
           "at the run's median step, and so charges slow steps as lost time")


def relative(runs: list[dict]) -> dict[str, dict]:
    """Per system: goodput under the schedule, undisturbed, and their ratio (the relative
    goodput), in both measures (per repeat; the median over repeats)."""
    import statistics

    def med(vals: list[float]) -> float | None:
        return statistics.median(vals) if vals else None

    out: dict[str, dict] = {}
    for name in SYSTEMS:
        pairs: dict[int, dict[bool, dict]] = {}
        for r in runs:
            if r.get("system") == name:
                pairs.setdefault(r["repeat"], {})[r["disturbed"]] = r
        if not pairs:
            continue

        def side(key: str, disturbed: bool, pairs: dict = pairs) -> list[float]:
            return [p[disturbed][key] for p in pairs.values()
                    if p.get(disturbed, {}).get(key) is not None]

        def rel_of(key: str, pairs: dict = pairs) -> list[float]:
            vals = [ratio(p[True].get(key), p[False].get(key))
                    for p in pairs.values() if True in p and False in p]
            return [x for x in vals if x is not None]

        out[name] = {
            "relative_goodput": med(rel_of("useful_step_time_share")),
            "relative_all": rel_of("useful_step_time_share"),
            "goodput": med(side("useful_step_time_share", True)),
            "undisturbed_goodput": med(side("useful_step_time_share", False)),
            "relative_goodput_median_step": med(rel_of("goodput")),
            "goodput_median_step": med(side("goodput", True)),
            "undisturbed_goodput_median_step": med(side("goodput", False)),
            "steps_lost": [p[True].get("steps_lost") for p in pairs.values() if True in p],
            "preemptions": [p[True].get("preemptions") for p in pairs.values() if True in p]}
    return out


def table(result: dict) -> str:
    s = result["settings"]
    rows = [f"Goodput on one standing cluster, {s['minutes']} min per window, a preemption "
            f"every {s['preempt_every_s']} s (notice {s['deadline_s']} s, capacity back "
            f"{s['replace_after_s']} s after the deadline); "
            f"{'VALID' if result['validity']['valid'] else 'NOT A RESULT'}",
            "| system | goodput | undisturbed | **relative goodput** | median-step goodput: "
            "scheduled / undisturbed = relative | steps lost | preemptions |",
            "|---|---|---|---|---|---|---|"]
    for name, f in result["figures"].items():
        rows.append(f"| {name} | {fmt(f['goodput'])} | {fmt(f['undisturbed_goodput'])} | "
                    f"**{fmt(f['relative_goodput'])}** | {fmt(f['goodput_median_step'])} / "
                    f"{fmt(f['undisturbed_goodput_median_step'])} = "
                    f"{fmt(f['relative_goodput_median_step'])} | {f['steps_lost']} | "
                    f"{f['preemptions']} |")
    return "\n".join([*rows, f"goodput: {GOODPUT}"])
