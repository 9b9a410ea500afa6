"""``python -m orchestrator.report RUN_DIR``: a self-contained HTML report (and a PNG) of a run.

Works on a run that is still going: the open state ends at "now" and a half-written last line of
any JSONL file is skipped. Writes RUN_DIR/report.html (the figure inlined as base64 PNG, so the
file can be mailed or attached to an issue) and RUN_DIR/report.png.
"""

from __future__ import annotations

import argparse
import base64
import html
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.metrics.goodput import CAUSES
from orchestrator.metrics.ml_goodput import BUCKETS as ML_BUCKETS
from orchestrator.metrics.ml_goodput import NOT_MEASURED as ML_NOT_MEASURED
from orchestrator.metrics.plots import figure_png, markers
from orchestrator.metrics.rundir import RunData, event_label, event_time, load_run
from orchestrator.shared.errors import OrchestratorError
from orchestrator.shared.files import atomic_write_bytes


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    png: Path


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _summary_rows(data: RunData) -> list[tuple[str, str]]:
    g = data.goodput
    last = data.steps[-1] if data.steps else None
    recent = data.steps[-50:]
    rows = [
        ("status", (data.timeline[-1]["state"] if data.timeline else "no timeline yet")
         + ("" if data.finished else f" (still running as of {_when(data.now)})")),
        ("run", str(data.run_info.get("run_id") or data.run_dir.name)),
        ("job", str(data.run_info.get("job_name") or data.run_info.get("job") or "")),
        ("step records", f"{data.total_steps:,}"),
        ("last step", f"{last.step:,}" if last else "n/a"),
        ("last loss", f"{last.loss:.4f}" if last else "n/a"),
        ("MFU (recent mean)", f"{statistics.fmean(r.mfu for r in recent) * 100:.2f}%"
         if recent else "n/a"),
        ("MFU peak", f"{last.peak_flops_per_device:.4g} FLOP/s per device, source "
         f"{last.peak_source}" if last else "n/a"),
        ("step time (recent median)",
         f"{statistics.median(r.step_time_s for r in recent) * 1e3:.1f} ms" if recent else "n/a"),
        ("tokens/s (last step)", f"{last.tokens_per_second:,.0f}" if last else "n/a"),
        ("wall time", f"{g.wall_s:,.1f} s"),
        ("goodput (cumulative)", f"{g.goodput * 100:.2f}%"),
        (f"goodput (rolling {g.rolling_window_s:g} s)", f"{g.rolling_goodput * 100:.2f}%"),
        ("lost (re-done) steps", f"{g.lost_steps:,}"),
        ("incarnations", str(len({int(r.get('incarnation', 0)) for r in data.timeline}))),
    ]
    rows += _eval_summary(data)
    if data.skipped:
        rows.append(("skipped lines", ", ".join(f"{k}: {v}" for k, v in data.skipped.items())
                     + " (partial or corrupt)"))
    return rows


def _eval_summary(data: RunData) -> list[tuple[str, str]]:
    """The newest eval of each split, or how to get one."""
    if not data.evals:
        return [("eval", "no eval records (eval.every > 0 evaluates the held-out split)")]
    newest = {r.split: r for r in data.evals}
    return [(f"{split} loss (last eval)", f"{r.loss:.4f} at step {r.step:,}, perplexity "
             f"{r.perplexity:.4g}") for split, r in sorted(newest.items())]


def _eval_section(data: RunData) -> str:
    """Every eval (the newest 200): step, split, loss, perplexity and the task's metrics."""
    if not data.evals:
        return ('<p class="muted">No eval records in metrics.jsonl: set eval.every to '
                "evaluate the task's held-out split (docs/tasks.md).</p>")
    names = sorted({k for r in data.evals for k in r.metrics})
    rows = [(f"{r.step:,}", r.split, f"{r.loss:.4f}", f"{r.perplexity:.4g}", f"{r.tokens:,}",
             f"{r.seconds:.2f}", *(f"{r.metrics[k]:.4g}" if k in r.metrics else "" for k in names))
            for r in data.evals[-200:]]
    return _table(("step", "split", "loss", "perplexity", "tokens", "seconds", *names), rows)


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
font-size:13px;text-align:left}th{background:#f3f3f3}img{max-width:100%;border:1px solid #ddd}
h2{margin-top:1.5em}.muted{color:#777;font-size:12px}"""


def render_html(data: RunData, png: bytes) -> str:
    g = data.goodput
    t0 = g.start
    badput_rows = [(c, f"{g.badput_s[c]:,.1f}",
                    f"{100 * g.badput_s[c] / g.wall_s:.1f}%" if g.wall_s else "0.0%")
                   for c in CAUSES if g.badput_s.get(c, 0.0) > 0]
    ml = g.ml_badput_s
    ml_rows = [(b, f"{ml[b]:,.1f}", f"{100 * ml[b] / g.wall_s:.1f}%" if g.wall_s else "0.0%")
               for b in ML_BUCKETS if ml.get(b, 0.0) > 0]
    ml_rows += [(b, "n/a", "not timed apart (inside the step)") for b in ML_NOT_MEASURED]
    slice_rows = [(name, f"{sg.productive_s:,.1f}", f"{sg.goodput * 100:.1f}%",
                   f"{sg.badput_s.get('absent', 0.0):,.1f}")
                  for name, sg in sorted(g.per_slice.items())]
    transitions = [(f"{float(r['at']) - t0:,.1f}", f"{r.get('prev')} -> {r['state']}",
                    r.get("reason", ""), r.get("incarnation", ""),
                    ",".join(r.get("slices") or ()), r.get("hosts", ""), r.get("step", ""))
                   for r in data.timeline]
    events = [(f"{(event_time(e) or t0) - t0:,.1f}", event_label(e), e.get("reason", ""))
              for e in data.events[-200:]]
    marks = [(n, f"{m.t - t0:,.1f}", m.label) for n, m in enumerate(markers(data), start=1)]
    img = base64.b64encode(png).decode("ascii")
    title = html.escape(str(data.run_info.get("run_id") or data.run_dir.name))
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>Run report: {title}</title><style>{CSS}</style></head><body>
<h1>Run report: {title}</h1>
<p class="muted">Generated {_when(data.now)} from {html.escape(str(data.run_dir))}.
MFU = model FLOPs per step / (step time x devices x peak FLOP/s per device); goodput =
productive time (RUNNING minus re-done steps and blocking saves) / wall time
(docs/metrics.md).</p>
{_table(("", ""), _summary_rows(data))}
<h2>Over time</h2>
<p class="muted">Loss (and eval loss), MFU, step time and goodput over wall time; the state
band shows the lifecycle with the slice count; dashed lines mark drains, re-forms, waits,
shrink/grow and handled events, each numbered on the state strip and listed under the figure
and below. A panel draws loss and eval loss by training step: steps re-done after a rollback
are drawn again, the lost ones in grey.</p>
<img alt="run report figure" src="data:image/png;base64,{img}">
<h2>Eval</h2>
{_eval_section(data)}
<h2>Badput by cause</h2>
{_table(("cause", "seconds", "share of wall time"), badput_rows)}
<h2>Badput in ml-goodput-measurement's buckets</h2>
<p class="muted">The same seconds in the buckets of Google's goodput library (docs/metrics.md).</p>
{_table(("bucket", "seconds", "share of wall time"), ml_rows)}
<h2>Per slice</h2>
{_table(("slice", "productive s", "goodput", "absent s"), slice_rows)}
<h2>Marked on the timeline</h2>
<p class="muted">The numbers are those on the figure's state strip (marks too close to tell
apart share one label, e.g. 3-7).</p>
{_table(("#", "t (s)", "what"), marks)}
<h2>State transitions</h2>
{_table(("t (s)", "transition", "reason", "incarnation", "slices", "hosts", "step"), transitions)}
<h2>Events (last 200)</h2>
{_table(("t (s)", "event", "reason"), events)}
</body></html>
"""


def build_report(run_dir: Path, *, clock: Callable[[], float] = time.time,
                 rolling_window_s: float = 300.0) -> ReportFiles:
    """Write RUN_DIR/report.html and RUN_DIR/report.png; returns their paths."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise OrchestratorError(f"run directory {run_dir} does not exist",
                                fix="pass the run's run.run_dir (e.g. runs/default)")
    data = load_run(run_dir, now=clock(), rolling_window_s=rolling_window_s)
    if not data.steps and not data.timeline:
        raise OrchestratorError(
            f"{run_dir} has neither metrics.jsonl nor timeline.jsonl records",
            fix="point at a run directory the driver has written to (wait for the first step)")
    png = figure_png(data)
    files = ReportFiles(html=run_dir / "report.html", png=run_dir / "report.png")
    atomic_write_bytes(files.png, png)
    atomic_write_bytes(files.html, render_html(data, png).encode("utf-8"))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.report",
                                     description="Render a run's report (HTML + PNG).",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("run_dir", type=Path,
                        help="the run directory (run.run_dir); works on a running run too; "
                             "writes RUN_DIR/report.html and report.png")
    parser.add_argument("--rolling-window-s", type=float, default=300.0,
                        help="seconds of the window the rolling goodput is taken over (the "
                             "driver's metrics.rolling_window_s)")
    args = parser.parse_args(argv)
    try:
        files = build_report(args.run_dir, rolling_window_s=args.rolling_window_s)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {files.html} and {files.png}")
    return 0

