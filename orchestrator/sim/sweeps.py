"""Sweeps over one sim config: checkpoint interval (against Young/Daly), spares, and scale.

Every variant keeps the config's seed(s), so the failure schedule is the same across the sweep
(common random numbers) and the curves compare policies, not luck.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from orchestrator.sim import models
from orchestrator.sim.config import SimConfig
from orchestrator.sim.runner import simulate

YD_FACTORS = (0.25, 0.35, 0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0, 2.8, 4.0)
SCALE_SIZES = ((1, 4), (4, 4), (4, 16), (16, 16), (64, 16), (256, 16))


def mtbf_s(cfg: SimConfig) -> float:
    """Mean time between *unannounced* failures of the job's mesh (announced ones lose no
    work, so they do not enter Young/Daly)."""
    f, t = cfg.failures, cfg.topology
    per_h = (f.host_per_hour * t.hosts + f.slice_loss_per_hour * t.slices
             + f.preemption_per_slice_hour * t.slices * f.notice_missed_fraction)
    return 3600.0 / per_h if per_h > 0 else math.inf


def save_cost_s(cfg: SimConfig) -> float:
    """The blocking cost of one save on the full mesh (it grows with the share per host)."""
    return models.save_blocking_s(cfg, cfg.topology.hosts)


def young_daly_steps(cfg: SimConfig) -> float:
    """Young's optimum sqrt(2·C·MTBF) in steps, C = the blocking cost of one save."""
    return models.young_daly_s(save_cost_s(cfg), mtbf_s(cfg)) / models.step_s(
        cfg, cfg.topology.slices)


def _fixed(cfg: SimConfig, every: int, seed: int) -> SimConfig:
    ci = replace(cfg.controller.checkpoint_interval, kind="fixed", every_steps=every)
    return replace(cfg, seed=seed, controller=replace(cfg.controller, checkpoint_interval=ci))


def fit_optimum(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares fit of goodput = a + b/x + c·x (Young's first-order model) and its
    maximum sqrt(b/c); None if the fit has no interior maximum."""
    rows = [(1.0, 1.0 / x, x) for x in xs]
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    v = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]

    def det(a: list[list[float]]) -> float:
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
                - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))

    d = det(m)
    if abs(d) < 1e-300:
        return None
    coef = []
    for k in range(3):
        mk = [row[:] for row in m]
        for i in range(3):
            mk[i][k] = v[i]
        coef.append(det(mk) / d)
    _, b, c = coef
    return math.sqrt(b / c) if b < 0 and c < 0 else None


def checkpoint_sweep(cfg: SimConfig, *, intervals: Sequence[int] | None = None,
                     seeds: Sequence[int] = (0, 1, 2)) -> dict[str, Any]:
    """Goodput vs a fixed checkpoint interval, with Young/Daly's optimum for comparison."""
    opt = young_daly_steps(cfg)
    if intervals is None:
        if not math.isfinite(opt):
            raise ValueError("no unannounced failures configured: Young/Daly has no optimum "
                             "(set failures.host_per_hour or pass intervals)")
        intervals = sorted({max(1, round(opt * f)) for f in YD_FACTORS})
    step = models.step_s(cfg, cfg.topology.slices)
    rows = []
    for every in intervals:
        results = [simulate(_fixed(cfg, every, seed), time_decisions=False) for seed in seeds]
        rows.append({"every_steps": every, "interval_s": every * step,
                     "goodput": sum(r.goodput for r in results) / len(results),
                     "goodput_min": min(r.goodput for r in results),
                     "goodput_max": max(r.goodput for r in results),
                     "lost_steps": sum(r.lost_steps for r in results) / len(results),
                     "recoveries": sum(sum(int(v["count"]) for v in r.recoveries.values())
                                       for r in results) / len(results)})
    fit = fit_optimum([r["every_steps"] for r in rows], [r["goodput"] for r in rows])
    best = max(rows, key=lambda r: r["goodput"])
    daly = models.daly_s(save_cost_s(cfg), mtbf_s(cfg)) / step
    return {"young_daly_steps": opt, "young_daly_s": opt * step, "mtbf_s": mtbf_s(cfg),
            "daly_steps": daly,
            "fit_vs_daly": (fit / daly - 1.0) if fit and math.isfinite(daly) else None,
            "save_cost_s": save_cost_s(cfg), "step_s": step,
            "fit_optimum_steps": fit, "argmax_steps": best["every_steps"],
            "fit_vs_young_daly": (fit / opt - 1.0) if fit and math.isfinite(opt) else None,
            "seeds": list(seeds), "rows": rows}


def spares_sweep(cfg: SimConfig, spares: Sequence[int] = (0, 1, 2, 4, 8),
                 seeds: Sequence[int] = (0,)) -> dict[str, Any]:
    """Goodput vs the number of idle spare slices kept in the cluster."""
    rows = []
    for n in spares:
        results = [simulate(replace(cfg, seed=s, topology=replace(cfg.topology, spare_slices=n)),
                            time_decisions=False) for s in seeds]
        waits = [r.badput_s.get("waiting_for_capacity", 0.0) for r in results]
        rows.append({"spare_slices": n,
                     "goodput": sum(r.goodput for r in results) / len(results),
                     "waiting_for_capacity_s": sum(waits) / len(waits),
                     "end_states": ",".join(sorted({r.state for r in results}))})
    return {"seeds": list(seeds), "rows": rows}


def scale_sweep(cfg: SimConfig, sizes: Sequence[tuple[int, int]] = SCALE_SIZES, *,
                horizon_h: float | None = None) -> dict[str, Any]:
    """Controller decision time (real wall time) vs mesh size. The per-host and per-slice
    rates are scaled so every size sees the configured topology's events per hour (a 4-host
    job would otherwise see almost none, and its decision times would be idle loops only)."""
    rows = []
    base_h, base_s = cfg.topology.hosts, cfg.topology.slices
    for slices, hps in sizes:
        fh, fs = base_h / (slices * hps), base_s / slices
        f = cfg.failures
        failures = replace(f, host_per_hour=f.host_per_hour * fh,
                           slice_loss_per_hour=f.slice_loss_per_hour * fs,
                           preemption_per_slice_hour=f.preemption_per_slice_hour * fs,
                           maintenance_per_slice_hour=f.maintenance_per_slice_hour * fs)
        c = replace(cfg, horizon_h=horizon_h or cfg.horizon_h, failures=failures,
                    topology=replace(cfg.topology, slices=slices, hosts_per_slice=hps))
        r = simulate(c)
        d = r.decision
        worst = max((v.get("p99_ms", 0.0) for v in d.get("by_event", {}).values()), default=0.0)
        rows.append({"slices": slices, "hosts": slices * hps, "decisions": d.get("count", 0),
                     "p50_ms": d.get("p50_ms"), "p99_ms": d.get("p99_ms"),
                     "max_ms": d.get("max_ms"), "worst_event_p99_ms": worst,
                     "events": sum(v.get("count", 0) for v in d.get("by_event", {}).values()),
                     "wall_s": r.wall_s, "simulated_h": r.simulated_s / 3600.0,
                     "goodput": r.goodput,
                     "steps_p50_ms": {k: v["p50_ms"] for k, v in d.get("by_step", {}).items()},
                     "steps_count": {k: v["count"] for k, v in d.get("by_step", {}).items()}})
    return {"rows": rows, "step_growth": step_growth(rows)}


def step_growth(rows: list[dict[str, Any]], floor_ms: float = 0.05) -> dict[str, Any]:
    """Per controller step (pair of seam calls), the log-log slope of its median wall time
    between the two largest sizes: 1 is linear in hosts. Steps under ``floor_ms`` at the
    largest size are left out (fixed overhead and timer noise, not growth)."""
    if len(rows) < 2:
        return {}
    a, b = rows[-2], rows[-1]
    ratio = math.log(b["hosts"] / a["hosts"])
    out = {}
    for k, vb in b["steps_p50_ms"].items():
        va = a["steps_p50_ms"].get(k)
        if va and vb and vb >= floor_ms:
            out[k] = {"slope": math.log(vb / va) / ratio, "p50_ms_small": va, "p50_ms_large": vb}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["slope"]))
