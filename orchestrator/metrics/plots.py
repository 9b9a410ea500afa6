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

from orchestrator.metrics.axes import layout_labels, time_unit
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


LABEL_PT, LABEL_ROWS = 6, 4  # event labels: font size (points), rows stacked above the strip


def _mark(ax: Any, ms: list[Marker], t0: float, unit: float) -> None:
    for m in ms:
        ax.axvline((m.t - t0) / unit, color=m.color, lw=0.8, ls="--", alpha=0.7)


def _label_events(fig: Figure, ax: Any, ms: list[Marker], t0: float, unit: float) -> None:
    """Event labels above the state strip, stacked so none overlaps another; those that fit in
    no row are left out and counted (their dashed lines stay; the events table lists all)."""
    lo, hi = ax.get_xlim()
    per_pt = (hi - lo) / max(1.0, ax.get_position().width * fig.get_figwidth() * 72)
    texts = [m.label[:40] for m in ms]
    # 0.62 em a character overestimates the font's average width: estimates err to spacing
    widths = [(len(t) * 0.62 * LABEL_PT + 2) * per_pt for t in texts]
    lay = layout_labels([(m.t - t0) / unit for m in ms], widths, rows=LABEL_ROWS,
                        gap=2 * per_pt, lo=lo, hi=hi)
    for m, text, row, left in zip(ms, texts, lay.rows, lay.lefts, strict=True):
        if row is not None:
            ax.annotate(text, (left, 1.0), xytext=(2, 2 + 8 * row), textcoords="offset points",
                        fontsize=LABEL_PT, color=m.color, annotation_clip=False)
    if lay.skipped:
        ax.set_xlabel(f"{ax.get_xlabel()} ({lay.skipped} event label(s) too close to show; "
                      "all are under 'Marked on the timeline')")


def build_figure(data: RunData) -> Figure:
    g = data.goodput
    t0 = g.start if g.wall_s > 0 else (data.steps[0].wall_time if data.steps else data.now)
    ms = markers(data)
    fig, axes = plt.subplots(6, 1, figsize=(12, 17), dpi=80,
                             gridspec_kw={"height_ratios": [3, 2, 2, 2, 1.6, 2.4]})
    ax_loss, ax_mfu, ax_time, ax_good, ax_state, ax_bad = axes
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
    peak = data.steps[-1].peak_source if data.steps else "n/a"
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(f"{data.run_info.get('run_id') or data.run_dir.name}: "
                      f"{data.total_steps} step records, "
                      f"{'finished' if data.finished else 'still running'}")
    if incs:
        ax_loss.legend(loc="upper right", fontsize=8, title="incarnation")
    ax_mfu.set_ylabel(f"MFU % ({peak})")
    ax_time.set_ylabel("step time (ms)")
    ax_good.plot([(s.t - t0) / unit for s in g.series], [s.cumulative * 100 for s in g.series],
                 label="cumulative", color="#31a354")
    ax_good.plot([(s.t - t0) / unit for s in g.series], [s.rolling * 100 for s in g.series],
                 label=f"rolling {g.rolling_window_s:g} s", color="#3182bd", alpha=0.8)
    ax_good.set_ylim(-2, 102)
    ax_good.set_ylabel("goodput %")
    ax_good.legend(loc="lower right", fontsize=8)

    seen: set[str] = set()
    for iv in g.intervals:
        if iv.duration_s <= 0:
            continue
        color = STATE_COLORS.get(iv.state, "#636363")
        ax_state.broken_barh([((iv.start - t0) / unit, iv.duration_s / unit)], (0, 1),
                             color=color, label=iv.state if iv.state not in seen else None)
        seen.add(iv.state)
    ax_state.set_yticks([])
    ax_state.set_ylabel("state")
    ax_slices = ax_state.twinx()
    if g.intervals:
        ax_slices.step([(iv.start - t0) / unit for iv in g.intervals] + [(g.end - t0) / unit],
                       [len(iv.slices) for iv in g.intervals] + [len(g.intervals[-1].slices)],
                       where="post", color="black", lw=1.2)
    ax_slices.set_ylabel("slices")
    ax_state.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=6, fontsize=7)
    for ax in (ax_loss, ax_mfu, ax_time, ax_good, ax_state):
        _mark(ax, ms, t0, unit)
        ax.grid(alpha=0.3)
    ax_state.set_xlabel(f"{unit_name} since the run started")
    lo = min([0.0, *xs])
    hi = max([(g.end - t0) / unit, *xs, 1e-3])
    for ax in (ax_loss, ax_mfu, ax_time, ax_good, ax_state):
        ax.set_xlim(lo, hi)
    _label_events(fig, ax_state, ms, t0, unit)

    causes = [c for c in CAUSES if g.badput_s.get(c, 0.0) > 0]
    values = [g.badput_s[c] for c in causes]
    ax_bad.barh(["productive", *causes], [g.productive_s, *values],
                color=["#31a354", *["#de2d26"] * len(causes)])
    for y, v in enumerate([g.productive_s, *values]):
        pct = 100 * v / g.wall_s if g.wall_s > 0 else 0.0
        ax_bad.text(v, y, f" {v:,.1f} s ({pct:.1f}%)", va="center", fontsize=8)
    ax_bad.set_xlabel("seconds")
    ax_bad.set_title(f"goodput {g.goodput * 100:.1f}% of {g.wall_s:,.0f} s wall time; "
                     "badput by cause")
    ax_bad.invert_yaxis()
    fig.tight_layout()
    return fig


def figure_png(data: RunData) -> bytes:
    fig = build_figure(data)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)
