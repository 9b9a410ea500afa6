"""The report's figure: loss, MFU, step time, goodput over time, the state timeline with events
and shrink/grow marked, and the badput breakdown (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from orchestrator.metrics.axes import group_marks, time_unit
from orchestrator.metrics.goodput import CAUSES, lost_step_records
from orchestrator.metrics.rundir import RunData, event_label, event_time

STATE_COLORS = {
    "PLANNING": "#bdbdbd", "FORMING": "#9e9ac8", "RESTORING": "#6baed6", "COMPILING": "#fdae6b",
    "RUNNING": "#31a354", "DRAINING": "#e6550d", "CHECKPOINTING": "#3182bd",
    "RELEASING": "#969696", "WAITING_FOR_CAPACITY": "#de2d26", "BACKOFF": "#fd8d3c",
    "SUCCEEDED": "#006d2c", "FAILED": "#a50f15", "STOPPED": "#54278f",
}


@dataclass(frozen=True, kw_only=True)
class Marker:
    """Something worth a vertical line on every time axis."""

    t: float
    label: str
    color: str


def markers(data: RunData, limit: int = 60) -> list[Marker]:
    """Drains, re-forms, waits, shrink/grow from the timeline; handled events from events.jsonl."""
    out: list[Marker] = []
    prev_slices: int | None = None
    prev_set: frozenset[str] = frozenset()
    for row in data.timeline:
        t, state = float(row["at"]), row["state"]
        if state == "DRAINING":
            out.append(Marker(t=t, label=f"drain ({row.get('reason', '')})", color="#e6550d"))
        cause = restart_cause_of_line(row)
        if cause is not None:
            out.append(Marker(t=t, label=f"re-form ({cause})", color="#756bb1"))
        if state == "WAITING_FOR_CAPACITY":
            out.append(Marker(t=t, label="waiting for capacity", color="#de2d26"))
        names = frozenset(str(x) for x in (row.get("slices") or ()))
        n = len(names)
        if n and prev_slices and n != prev_slices:
            word = "grow" if n > prev_slices else "shrink"
            out.append(Marker(t=t, label=f"{word} {prev_slices}->{n} slices",
                              color="#2ca25f" if n > prev_slices else "#f03b20"))
        elif n and prev_set and names != prev_set:
            gone, new = sorted(prev_set - names), sorted(names - prev_set)
            out.append(Marker(t=t, label=f"replaced {','.join(gone)} by {','.join(new)}",
                              color="#2c7fb8"))
        if n:
            prev_slices, prev_set = n, names
    for row in data.events:
        t = event_time(row)
        if t is not None and row.get("decision") not in ("duplicate", "stale", "ignored"):
            out.append(Marker(t=t, label=event_label(row), color="#c51b8a"))
    out.sort(key=lambda m: m.t)
    return out[:limit]


def restart_cause_of_line(row: Mapping[str, Any]) -> str | None:
    """The re-form cause of a timeline.jsonl line: its ``Planning`` payload's (a StopCause
    value, or ``grow``), as live sinks read ``Transition.restart_cause``."""
    payload = row.get("payload") or {}
    if payload.get("type") == "Planning":
        return "grow" if payload.get("grow") else payload.get("cause")
    return _legacy_restart_cause(row) if not payload else None


# ---- LEGACY: timeline files written before issue 27 -----------------------------------------
# Their PLANNING lines carry no payload: the cause was only in the reason text ("re-forming
# after spot_preemption: ..."), and a re-form was PLANNING from any state or FORMING from
# anything but PLANNING. Only reading such files needs this; no new line has that shape.
_WORD = re.compile(r"[a-z0-9_]+")
_AFTER = re.compile(r"\bafter ([a-z0-9_]+)")


def _legacy_restart_cause(row: Mapping[str, Any]) -> str | None:
    state, prev = row.get("state"), row.get("prev")
    if not ((state == "PLANNING" and prev is not None)
            or (state == "FORMING" and prev not in (None, "PLANNING"))):
        return None
    text = str(row.get("reason") or "").strip().lower().replace("-", "_")
    after, word = _AFTER.search(text), _WORD.match(text)
    label = after.group(1) if after else word.group(0) if word else "unknown"
    return label[:64]


MARK_PT = 8  # the marks' numbers on the state strip (points)
LEGEND_PT, LEGEND_COLS = 7, 2  # the marks' legend under the figure: font size, columns
CHAR_EM = 0.62  # a character's width in ems: above the font's average, so estimates err wide
STATE_TOP = 1.7  # the state strip's y range: the band fills 0-1, the marks' numbers sit above


def _mark(ax: Any, ms: list[Marker], t0: float, unit: float) -> None:
    for m in ms:
        ax.axvline((m.t - t0) / unit, color=m.color, lw=0.8, ls="--", alpha=0.7)


def _points_per_unit(fig: Figure, ax: Any) -> float:
    """Data units per point along ``ax``'s x axis (after its limits are set)."""
    lo, hi = ax.get_xlim()
    return (hi - lo) / max(1.0, ax.get_position().width * fig.get_figwidth() * 72)


def _number_marks(fig: Figure, ax: Any, ms: list[Marker], t0: float, unit: float) -> None:
    """Each mark's number (as the legend lists it) inside the state strip, above the band;
    marks too close to tell apart share one label (``3-7``): every mark is labelled, none
    overlaps another, and the legend says what each is."""
    per_pt = _points_per_unit(fig, ax)
    lo, hi = ax.get_xlim()
    pad = 1.5  # points of white box each side, so no dashed line crosses a number
    groups = group_marks([(m.t - t0) / unit for m in ms], char_width=CHAR_EM * MARK_PT * per_pt,
                         gap=(3 + 2 * pad) * per_pt, lo=lo + (pad + 1) * per_pt,
                         hi=hi - (pad + 1) * per_pt)
    for g in groups:
        ax.text(g.left, 1.35, g.text, fontsize=MARK_PT, va="center", ha="left",
                color=ms[g.first - 1].color, fontweight="bold",
                bbox={"boxstyle": f"square,pad={pad / MARK_PT:.3f}", "facecolor": "white",
                      "edgecolor": "none"})


def _legend_lines(ms: list[Marker], t0: float, unit: float, unit_name: str,
                  chars: int) -> list[str]:
    """``12  34.5 s  drain (spot_preemption)``, cut to ``chars`` characters."""
    short = {"seconds": "s", "minutes": "min", "hours": "h"}[unit_name]
    out = []
    for n, m in enumerate(ms, start=1):
        line = f"{n:>2}  {(m.t - t0) / unit:,.1f} {short}  {m.label}"
        out.append(line if len(line) <= chars else line[:chars - 1] + "\u2026")
    return out


def _legend(fig: Figure, ax: Any, ms: list[Marker], t0: float, unit: float,
            unit_name: str) -> None:
    """The marks' legend: number, time and what, in columns that fit the panel."""
    ax.axis("off")
    if not ms:
        ax.text(0.0, 0.5, "nothing marked on the timeline", fontsize=LEGEND_PT, va="center")
        return
    col_pt = ax.get_position().width * fig.get_figwidth() * 72 / LEGEND_COLS
    chars = int(col_pt / (CHAR_EM * LEGEND_PT)) - 2
    lines = _legend_lines(ms, t0, unit, unit_name, chars)
    rows = -(-len(lines) // LEGEND_COLS)
    ax.set_title("marked on the timeline (the numbers on the state strip)", fontsize=8,
                 loc="left")
    for k, line in enumerate(lines):
        col, row = divmod(k, rows)
        ax.text(col / LEGEND_COLS, 1 - (row + 0.5) / rows, line, fontsize=LEGEND_PT,
                va="center", ha="left", family="monospace", color=ms[k].color)


def _legend_height(n: int) -> float:
    """Inches the legend needs for ``n`` marks (a row of 7 pt text is ~0.15 in)."""
    return 0.35 + 0.15 * max(1, -(-n // LEGEND_COLS))


def _loss_by_step(ax: Any, data: RunData, lost: set[int]) -> None:
    """Loss (and eval loss) against the training step: a restore goes back, so the steps
    re-done after a rollback are drawn again, the lost ones in grey."""
    if lost:
        pts = [r for r in data.steps if id(r) in lost]
        ax.scatter([r.step for r in pts], [r.loss for r in pts], s=8, color="#bdbdbd",
                   zorder=3, label="lost (re-done)")
    for inc in sorted({r.incarnation for r in data.steps}):
        pts = [r for r in data.steps if r.incarnation == inc]
        ax.plot([r.step for r in pts], [r.loss for r in pts], lw=1, label=f"inc {inc}")
    for split, recs in _eval_splits(data).items():
        ax.plot([r.step for r in recs], [r.loss for r in recs], marker="o", ms=4, lw=1.2,
                color="black", ls=":", label=f"{split} loss")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss")
    ax.set_title("loss by training step", fontsize=10)
    ax.grid(alpha=0.3)
    if data.steps or data.evals:
        ax.legend(loc="best", fontsize=8)


def _eval_splits(data: RunData) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for rec in data.evals:
        out.setdefault(rec.split, []).append(rec)
    return out


def _eval_on_time(ax: Any, data: RunData, t0: float, unit: float) -> None:
    """Eval loss at its wall time on the loss panel (records without one are by step only)."""
    for split, recs in _eval_splits(data).items():
        timed = [r for r in recs if r.wall_time > 0]
        if timed:
            ax.plot([(r.wall_time - t0) / unit for r in timed], [r.loss for r in timed],
                    marker="o", ms=4, lw=1.2, color="black", ls=":", label=f"{split} loss")


def _badput_bars(fig: Figure, ax: Any, g: Any) -> None:
    causes = [c for c in CAUSES if g.badput_s.get(c, 0.0) > 0]
    values = [g.productive_s, *(g.badput_s[c] for c in causes)]
    ax.barh(["productive", *causes], values, color=["#31a354", *["#de2d26"] * len(causes)])
    texts = []
    for y, v in enumerate(values):
        pct = 100 * v / g.wall_s if g.wall_s > 0 else 0.0
        texts.append(ax.text(v, y, f" {v:,.1f} s ({pct:.1f}%)", va="center", fontsize=8))
    # room right of the longest bar for its number, so every number is inside the panel
    width_pt = ax.get_position().width * fig.get_figwidth() * 72
    room = max(len(t.get_text()) for t in texts) * CHAR_EM * 8 / max(1.0, width_pt)
    ax.set_xlim(0, max([*values, 1e-9]) / max(0.2, 1 - room - 0.02))
    ax.set_xlabel("seconds")
    ax.set_title(f"goodput {g.goodput * 100:.1f}% of {g.wall_s:,.0f} s wall time; "
                 "badput by cause", fontsize=10)
    ax.invert_yaxis()


def build_figure(data: RunData) -> Figure:
    """Panels over wall time (loss and eval loss, MFU, step time, goodput, the state strip
    with numbered marks), loss by training step, badput, and the marks' legend."""
    g = data.goodput
    t0 = g.start if g.wall_s > 0 else (data.steps[0].wall_time if data.steps else data.now)
    ms = markers(data)
    legend_h = _legend_height(len(ms))
    fig, axes = plt.subplots(8, 1, figsize=(12, 19.6 + legend_h), dpi=80,
                             gridspec_kw={"height_ratios": [3, 2, 2, 2, 1.6, 2.6, 2.4,
                                                            legend_h / 0.75]})
    ax_loss, ax_mfu, ax_time, ax_good, ax_state, ax_by_step, ax_bad, ax_legend = axes
    unit, unit_name = time_unit(max([g.end - t0, *(r.wall_time - t0 for r in data.steps), 0.0]))
    xs = [(r.wall_time - t0) / unit for r in data.steps]
    incs = sorted({r.incarnation for r in data.steps})
    lost = {id(r) for r in lost_step_records(data.timeline, data.steps)}
    if lost:
        lx = [x for x, r in zip(xs, data.steps, strict=True) if id(r) in lost]
        ly = [r.loss for r in data.steps if id(r) in lost]
        ax_loss.scatter(lx, ly, s=8, color="#bdbdbd", zorder=3, label="lost (re-done)")
    for inc in incs:
        pts = [(x, r) for x, r in zip(xs, data.steps, strict=True) if r.incarnation == inc]
        ax_loss.plot([x for x, _ in pts], [r.loss for _, r in pts], lw=1, label=f"inc {inc}")
        ax_mfu.plot([x for x, _ in pts], [r.mfu * 100 for _, r in pts], lw=1)
        ax_time.plot([x for x, _ in pts], [r.step_time_s * 1e3 for _, r in pts], lw=1)
    _eval_on_time(ax_loss, data, t0, unit)
    peak = data.steps[-1].peak_source if data.steps else "n/a"
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(f"{data.run_info.get('run_id') or data.run_dir.name}: "
                      f"{data.total_steps} step records, "
                      f"{'finished' if data.finished else 'still running'}")
    if incs or data.evals:
        ax_loss.legend(loc="upper right", fontsize=8)
    ax_mfu.set_ylabel("MFU %")
    ax_mfu.set_title(f"MFU, peak FLOP/s: {peak}", fontsize=9, loc="left")
    ax_time.set_ylabel("step time (ms)")
    ax_good.plot([(s.t - t0) / unit for s in g.series], [s.cumulative * 100 for s in g.series],
                 label="cumulative", color="#31a354")
    ax_good.plot([(s.t - t0) / unit for s in g.series], [s.rolling * 100 for s in g.series],
                 label=f"rolling {g.rolling_window_s:g} s", color="#3182bd", alpha=0.8)
    ax_good.set_ylim(-2, 102)
    ax_good.set_ylabel("goodput %")
    ax_good.legend(loc="lower right", fontsize=8)

    _state_strip(ax_state, g, t0, unit)
    for ax in (ax_loss, ax_mfu, ax_time, ax_good, ax_state):
        _mark(ax, ms, t0, unit)
        ax.grid(alpha=0.3)
    ax_state.set_xlabel(f"{unit_name} since the run started")
    lo = min([0.0, *xs])
    hi = max([(g.end - t0) / unit, *xs, 1e-3])
    for ax in (ax_loss, ax_mfu, ax_time, ax_good, ax_state):
        ax.set_xlim(lo, hi)
    _loss_by_step(ax_by_step, data, lost)
    # sized on the axes' widths before the layout, which only widens them: estimates err wide
    _number_marks(fig, ax_state, ms, t0, unit)
    _badput_bars(fig, ax_bad, g)
    _legend(fig, ax_legend, ms, t0, unit, unit_name)
    fig.tight_layout()
    return fig


def _state_strip(ax: Any, g: Any, t0: float, unit: float) -> None:
    """The lifecycle as coloured bands (0-1) with the slice count; the top is left for the
    marks' numbers."""
    seen: set[str] = set()
    for iv in g.intervals:
        if iv.duration_s <= 0:
            continue
        color = STATE_COLORS.get(iv.state, "#636363")
        ax.broken_barh([((iv.start - t0) / unit, iv.duration_s / unit)], (0, 1),
                       color=color, label=iv.state if iv.state not in seen else None)
        seen.add(iv.state)
    ax.set_ylim(0, STATE_TOP)
    ax.set_yticks([])
    ax.set_ylabel("state")
    ax_slices = ax.twinx()
    top = max([len(iv.slices) for iv in g.intervals] or [1])
    if g.intervals:
        ax_slices.step([(iv.start - t0) / unit for iv in g.intervals] + [(g.end - t0) / unit],
                       [len(iv.slices) for iv in g.intervals] + [len(g.intervals[-1].slices)],
                       where="post", color="black", lw=1.2)
    ax_slices.set_ylim(0, top * STATE_TOP)
    ax_slices.set_yticks(range(top + 1))
    ax_slices.set_ylabel("slices")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=7, fontsize=7)


def figure_png(data: RunData) -> bytes:
    fig = build_figure(data)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)
