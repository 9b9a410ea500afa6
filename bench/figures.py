"""Figures from raw run outputs: pure functions of parsed records (no processes, no clock).

Each returns a JSON-ready dict. Timed values come from the runs' own clocks (``wall_time`` of
step records, ``at`` of timeline lines, the controller's ``recoveries``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from bench.orchestrated import RunDir
from bench.stats import ratio, spread


def steady_steps(records: Sequence[dict], *, skip: int) -> list[dict]:
    """Step records after the first ``skip`` (compile/warm-up) of the first incarnation."""
    first_inc = min((r.get("incarnation", 1) for r in records), default=1)
    recs = [r for r in records if r.get("incarnation", 1) == first_inc]
    return sorted(recs, key=lambda r: r["step"])[skip:]


def per_step_wall(records: Sequence[dict]) -> float | None:
    """Wall seconds per step between the first and last record (includes every gap between
    steps: driver round trips, event polling, metric export)."""
    if len(records) < 2:
        return None
    a, b = records[0], records[-1]
    return (b["wall_time"] - a["wall_time"]) / (b["step"] - a["step"])


def between_steps_share(records: Sequence[dict]) -> float | None:
    """Share of wall time spent outside steps, within one run (robust to load drifting between
    runs): Σ(gap between consecutive step ends − the later step's own time) / Σ gaps. Pairs where
    either step issued a save, or the later one ran during one, are left out."""
    outside = total = 0.0
    recs = sorted(records, key=lambda r: r["step"])
    for a, b in itertools.pairwise(recs):
        if b["step"] != a["step"] + 1 or a.get("save_blocking_s") or b.get("save_blocking_s") \
                or b.get("save_in_flight") or a.get("checkpoint_blocking_s"):
            continue
        gap = b["wall_time"] - a["wall_time"]
        total += gap
        outside += max(0.0, gap - b["step_time_s"])
    return outside / total if total > 0 else None


def clean_bare_steps(bare: dict, *, skip: int) -> list[dict]:
    """Bare-loop steps with no save issued and none in flight (figure 1's baseline)."""
    return [r for r in bare["records"][skip:]
            if not r["save_in_flight"] and not r["save_blocking_s"]]


def overhead(orch_runs: Sequence[list[dict]], bare_runs: Sequence[dict], *, skip: int) -> dict:
    """Figure 1: orchestrated median step time / bare median step time, per repeat and overall."""
    orch_medians, bare_medians, orch_wall, bare_wall = [], [], [], []
    orch_outside, bare_outside = [], []
    for recs in orch_runs:
        st = steady_steps(recs, skip=skip)
        orch_medians.append(spread([r["step_time_s"] for r in st])["median"])
        orch_wall.append(per_step_wall(st))
        orch_outside.append(between_steps_share(st))
    for b in bare_runs:
        clean = clean_bare_steps(b, skip=skip)
        bare_medians.append(spread([r["step_time_s"] for r in clean])["median"])
        bare_wall.append(per_step_wall(b["records"][skip:]))
        bare_outside.append(between_steps_share(b["records"][skip:]))
    pairs = [ratio(o, b) for o, b in zip(orch_medians, bare_medians, strict=False)]
    wall_pairs = [ratio(o, b) for o, b in zip(orch_wall, bare_wall, strict=False)]
    om = spread([v for v in orch_medians if v is not None])
    bm = spread([v for v in bare_medians if v is not None])
    return {
        "ratio_step_time": ratio(om["median"], bm["median"]),
        "ratio_step_time_per_repeat": spread([p for p in pairs if p is not None]),
        "ratio_wall_per_step": ratio(spread([w for w in orch_wall if w]).get("median"),
                                     spread([w for w in bare_wall if w]).get("median")),
        "ratio_wall_per_step_per_repeat": spread([p for p in wall_pairs if p is not None]),
        "orchestrated_step_s": om, "bare_step_s": bm,
        "orchestrated_wall_per_step_s": spread([w for w in orch_wall if w]),
        "bare_wall_per_step_s": spread([w for w in bare_wall if w]),
        "orchestrated_outside_steps_share": spread([v for v in orch_outside if v is not None]),
        "bare_outside_steps_share": spread([v for v in bare_outside if v is not None]),
        "target": "<= 1.02",
    }


def announced_recovery(run: RunDir) -> dict:
    """Figure 2 (one run): the first announced recovery of an orchestrated run, by phase."""
    recs = [r for r in run.summary.get("recoveries", []) if r.get("kind") == "announced"]
    if not recs:
        return {"ok": False, "problem": "no announced recovery in summary.json",
                "state": run.summary.get("state"), "reason": run.summary.get("reason")}
    r = recs[0]
    notice = r["started_at"]  # the notice's arrival (announced recoveries)
    # The drain's own save commits when CHECKPOINTING ends; when the boundary step was already
    # saved (periodically, async), teardown waits for that save: committed when RELEASING ends.
    after_notice = [t for t in run.timeline if t["at"] >= notice]
    saved = next((t for t in after_notice if t.get("prev") == "CHECKPOINTING"), None)
    released = next((t for t in after_notice if t.get("prev") == "RELEASING"), None)
    committed_by = "drain save" if saved else "periodic save, waited for at release"
    committed = (saved or released or {}).get("at")
    before = [m for m in run.metrics if m["wall_time"] <= notice]
    inc_before = max((m.get("incarnation", 1) for m in before), default=1)
    after = [m for m in run.metrics if m.get("incarnation", 1) > inc_before]
    first = min(after, key=lambda m: m["wall_time"]) if after else None
    reached = max((m["step"] for m in run.metrics if m.get("incarnation", 1) <= inc_before),
                  default=None)
    resumed_from = first["step"] - 1 if first else None
    return {
        "ok": True, "state": run.summary.get("state"),
        "notice_step": r.get("step"), "saved_step": r.get("saved_step"),
        "steps_lost": r.get("lost_steps", 0),
        "steps_lost_from_records": (reached - resumed_from) if first and reached else None,
        "notice_to_committed_s": (committed - notice) if committed else None,
        "committed_by": committed_by,
        "notice_to_first_step_s": (first["wall_time"] - notice) if first else None,
        "notice_to_first_chunk_s": r.get("to_first_step_s"),
        "phases_s": r.get("phases_s", {}), "save_s": r.get("save_s"),
        "first_step_time_s": first["step_time_s"] if first else None,
        "summary_goodput": run.summary.get("goodput"), "wall_s": run.summary.get("wall_s"),
        "final_step": run.summary.get("step"),
    }


def kill_moment(run: RunDir, *, exited_at: float) -> dict | None:
    """When the injected kill stopped the job: its first transition out of RUNNING (None if
    it never left RUNNING, or finished)."""
    if run.summary.get("state") == "SUCCEEDED":
        return None
    left = [t for t in run.timeline if t.get("prev") == "RUNNING"]
    if not left:
        return None
    at = float(left[0]["at"])
    return {"killed_at": at, "stop_s": exited_at - at, "exit_code": run.summary.get("exit_code")}


def full_restart(killed: dict, first_run: RunDir, second_run: RunDir) -> dict:
    """Figure 3b (one run): the job killed at the notice and resubmitted on the same run dir."""
    t_kill = killed["killed_at"]
    reached = max((m["step"] for m in first_run.metrics if m["wall_time"] <= t_kill + 60),
                  default=None)
    after = [m for m in second_run.metrics if m["wall_time"] > t_kill]
    first = min(after, key=lambda m: m["wall_time"]) if after else None
    resumed_from = first["step"] - 1 if first else None
    return {
        "ok": first is not None and not second_run.retries, "kill_step": reached,
        "resubmit_startup_retries": second_run.retries, "resumed_from_step": resumed_from,
        "steps_lost": (reached - resumed_from) if (first and reached is not None) else None,
        "notice_to_first_step_s": (first["wall_time"] - t_kill) if first else None,
        "old_job_stop_s": killed["stop_s"],
        "second_run_state": second_run.summary.get("state"),
        "final_step": second_run.summary.get("step"),
    }


def recovery_vs_restart(orch: Sequence[dict], restart: Sequence[dict]) -> dict:
    """Figure 3: median notice → first productive step, orchestrator / full restart."""
    a = spread([r["notice_to_first_step_s"] for r in orch
                if r.get("ok") and r.get("notice_to_first_step_s")])
    b = spread([r["notice_to_first_step_s"] for r in restart
                if r.get("ok") and r.get("notice_to_first_step_s")])
    return {"ratio": ratio(a["median"], b["median"]), "orchestrator_s": a, "full_restart_s": b,
            "steps_lost_orchestrator": [r.get("steps_lost") for r in orch],
            "steps_lost_full_restart": [r.get("steps_lost") for r in restart],
            "runs_full_restart": list(restart), "target": "<= 0.25"}


def checkpoint_inflation(bare_runs: Sequence[dict], *, skip: int) -> dict:
    """Figure 5: step time while an async save is issued or in flight / step time without."""
    during, without, blocking = [], [], []
    for b in bare_runs:
        for r in b["records"][skip:]:
            if r["save_blocking_s"]:
                during.append(r["step_time_s"] + r["save_blocking_s"])
                blocking.append(r["save_blocking_s"])
            elif r["save_in_flight"]:
                during.append(r["step_time_s"])
            else:
                without.append(r["step_time_s"])
    d, w = spread(during), spread(without)
    return {"ratio": ratio(d["median"], w["median"]), "during_save_step_s": d,
            "without_save_step_s": w, "save_blocking_s": spread(blocking),
            "definition": "a step 'during' a save is the step that issues it (its blocking part "
                          "added) or one that starts while Orbax's async commit is in flight"}


def goodput(*, useful_steps: int | None, step_s: float | None,
            wall_s: float | None) -> float | None:
    """Useful (net) steps × the system's own median step time / wall time."""
    if useful_steps is None or step_s is None or not wall_s:
        return None
    return useful_steps * step_s / wall_s
