"""Printing and writing simulation results: text tables, text plots, CSV/JSON, and PNGs.

PNG plots use matplotlib, already a project dependency (the run report uses it); every figure is
also written as CSV and as a text plot, so a terminal or a diff shows it without an image viewer.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.sim.runner import SimResult


def _pct(x: float) -> str:
    return f"{100.0 * x:.2f}%"


def format_result(r: SimResult) -> str:
    """The one-run summary a user reads first."""
    wall = r.simulated_s
    lines = [
        f"simulated {r.simulated_s / 3600:.1f} h of {r.slices} slices x "
        f"{r.hosts // max(1, r.slices)} hosts ({r.hosts} hosts, {r.spare_slices} spare slices)"
        f" in {r.wall_s:.1f} s wall ({r.simulated_s / max(r.wall_s, 1e-9):,.0f}x real time)",
        f"end state {r.state}: {r.reason}",
        f"goodput {_pct(r.goodput)}  (productive {r.productive_s / 3600:.2f} h; "
        f"step {r.model.get('step_s', 0):.3g} s, save blocks "
        f"{r.model.get('save_blocking_s', 0):.3g} s, commits in "
        f"{r.model.get('save_commit_s', 0):.3g} s, restore "
        f"{r.model.get('restore_s', 0):.3g} s)",
        f"steps {r.steps:,}, lost (re-done) steps {r.lost_steps:,}, last committed "
        f"{r.last_committed_step}",
        "badput by cause:",
    ]
    for k, v in sorted(r.badput_s.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<22} {v:>12.1f} s  {_pct(v / wall if wall else 0.0):>8}")
    lines.append("time in state:")
    for k, v in sorted(r.time_in_state_s.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<22} {v:>12.1f} s  {_pct(v / wall if wall else 0.0):>8}")
    lines.append("recoveries by kind:")
    for k, v in r.recoveries.items():
        lines.append(f"  {k:<34} {v['count']:>5}  mean to RUNNING {v['mean_to_running_s']:.1f} s"
                     f", lost steps {v['lost_steps']}, further failures meanwhile "
                     f"{v['further_failures']}")
    if not r.recoveries:
        lines.append("  none")
    lines.append("world happenings: " + (", ".join(f"{k} {v}" for k, v in r.happenings.items())
                                         or "none"))
    d = r.decision
    if d.get("count"):
        lines.append(f"controller decision time (wall, per decision, n={d['count']:,}): "
                     f"p50 {d['p50_ms']:.3f} ms, p99 {d['p99_ms']:.3f} ms, "
                     f"max {d['max_ms']:.1f} ms; the controller took {d['controller_s']:.1f} s "
                     f"of the wall time, the simulated world {d['simulator_s']:.1f} s")
        for k, v in d.get("by_event", {}).items():
            lines.append(f"  after {k:<24} n={v['count']:<5} p50 {v['p50_ms']:.3f} ms, "
                         f"p99 {v['p99_ms']:.3f} ms, max {v['max_ms']:.1f} ms")
        steps = sorted(d.get("by_step", {}).items(), key=lambda kv: -kv[1]["max_ms"])[:4]
        lines.append("  costliest steps (between seam calls): " + "; ".join(
            f"{k} p50 {v['p50_ms']:.2f} / max {v['max_ms']:.1f} ms (n={v['count']})"
            for k, v in steps))
    return "\n".join(lines)


def text_plot(xs: Sequence[float], ys: Sequence[float], *, mark_x: float | None = None,
              width: int = 64, height: int = 14, xlabel: str = "x", ylabel: str = "y",
              logx: bool = False, logy: bool = False) -> str:
    """A scatter plot in characters; ``mark_x`` draws a column of '|' (e.g. an optimum)."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    if not pts:
        return "(no data)"
    fx = (lambda v: math.log10(max(v, 1e-12))) if logx else (lambda v: v)
    fy = (lambda v: math.log10(max(v, 1e-12))) if logy else (lambda v: v)
    tx = [fx(x) for x, _ in pts] + ([fx(mark_x)] if mark_x else [])
    ty = [fy(y) for _, y in pts]
    x0, x1 = min(tx), max(tx)
    y0, y1 = min(ty), max(ty)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1e-9)
    grid = [[" "] * width for _ in range(height)]

    def col(v: float) -> int:
        return min(width - 1, round((v - x0) / (x1 - x0) * (width - 1)))

    if mark_x:
        for row in grid:
            row[col(fx(mark_x))] = "|"
    for (x, y) in pts:
        r = height - 1 - min(height - 1, round((fy(y) - y0) / (y1 - y0) * (height - 1)))
        grid[r][col(fx(x))] = "*"
    top, bottom = (10 ** y1 if logy else y1), (10 ** y0 if logy else y0)
    out = [f"{ylabel} (top {top:.4g}, bottom {bottom:.4g})"]
    out += ["  |" + "".join(row) for row in grid]
    left, right = (10 ** x0 if logx else x0), (10 ** x1 if logx else x1)
    out.append("  +" + "-" * width)
    out.append(f"   {xlabel}: {left:.4g} .. {right:.4g}" + (" (log)" if logx else "")
               + (f"; '|' at {mark_x:.4g}" if mark_x else ""))
    return "\n".join(out)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def plot_png(path: Path, series: dict[str, tuple[Sequence[float], Sequence[float]]], *,
             xlabel: str, ylabel: str, title: str, marks: dict[str, float] | None = None,
             logx: bool = False, logy: bool = False) -> bool:
    """A line plot per series, vertical lines for ``marks``; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    styles = ("--", ":", "-.")
    for i, (label, x) in enumerate((marks or {}).items()):
        ax.axvline(x, linestyle=styles[i % 3], color=f"C{i + 1}",
                   label=f"{label} ({x:.4g})")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(series) > 1 or marks:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
