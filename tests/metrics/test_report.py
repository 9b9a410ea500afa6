"""The run report renders for a realistic synthetic run directory, finished or still going."""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.metrics.plots import markers
from orchestrator.metrics.records import EvalRecord
from orchestrator.metrics.rundir import load_run
from orchestrator.report import build_report
from orchestrator.shared.errors import OrchestratorError
from tests.metrics.synthetic import T0, preempt_shrink_grow_run

REPO = Path(__file__).resolve().parents[2]


def write_run(run_dir: Path, *, partial_tail: bool) -> float:
    """A run dir like the driver writes: metrics, timeline, events, run.json. Returns 'now'."""
    tl, steps, now = preempt_shrink_grow_run()
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for r in steps:
            fh.write(json.dumps(r.to_dict()) + "\n")
        if partial_tail:
            fh.write('{"step": 101, "loss": 3.9')  # the writer is mid-line
    with open(run_dir / "timeline.jsonl", "w") as fh:
        for row in tl:
            fh.write(json.dumps(row) + "\n")
    events = [
        {"seq": 1, "at": T0 + 70, "received_at": T0 + 70, "decision": "accepted", "reason": "",
         "via": "metadata", "event": {"kind": "preemption_notice", "observed_at": T0 + 70,
                                      "target": {"job": None, "slice": "s1", "host": "3"}}},
        {"seq": 2, "at": T0 + 71, "decision": "action", "event_id": "e1",
         "kind": "preemption_notice", "action": "drain"},
        {"seq": 3, "at": T0 + 72, "decision": "duplicate", "reason": "seen",
         "event": {"kind": "preemption_notice"}},
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "run.json").write_text(json.dumps({"run_id": "run-abc", "job_name": "demo"}))
    return now


def test_report_renders_a_run_still_going(tmp_path):
    """HTML + PNG exist; the HTML embeds the figure and shows MFU, goodput and badput causes."""
    run_dir = tmp_path / "run"
    now = write_run(run_dir, partial_tail=True)
    files = build_report(run_dir, clock=lambda: now)
    assert files.html.exists() and files.png.exists()
    png = files.png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    page = files.html.read_text()
    embedded = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert embedded is not None and base64.b64decode(embedded[1]) == png
    assert "still running" in page
    assert "goodput (cumulative)</td><td>36.88%" in page  # 59 s of 160 s
    assert "MFU peak" in page and "configured" in page
    for cause in ("startup", "compile", "lost_steps", "waiting_for_capacity", "reform", "drain"):
        assert f"<td>{cause}</td>" in page
    for bucket in ("tpu_initialization", "program_startup", "wasted_progress_from_disruption",
                   "infrastructure_recovery_from_disruption"):
        assert f"<td>{bucket}</td>" in page
    assert "<td>data_loading_sync</td><td>n/a</td>" in page
    assert "metrics.jsonl: 1 (partial or corrupt)" in page
    assert "preemption_notice (slice s1, host 3): accepted" in page
    assert "shrink 2-&gt;1 slices" in page and "grow 1-&gt;2 slices" in page
    assert "re-form (preempted)" in page and "re-form (grow)" in page


def test_report_data_holds_every_series(tmp_path):
    """The loaded run has all steps of every incarnation and the goodput time series."""
    run_dir = tmp_path / "run"
    now = write_run(run_dir, partial_tail=False)
    data = load_run(run_dir, now=now)
    assert data.total_steps == 150 and data.skipped == {}
    assert {r.incarnation for r in data.steps} == {0, 1, 2}
    assert data.goodput.series[-1].cumulative == pytest.approx(59 / 160)
    labels = [m.label for m in markers(data)]
    assert "drain (preemption)" in labels and "waiting for capacity" in labels
    assert not any("duplicate" in x for x in labels)


def test_report_thins_a_long_run_but_keeps_the_last_step(tmp_path):
    """A long metrics.jsonl is plotted from at most max_points records, ending at the newest."""
    run_dir = tmp_path / "run"
    write_run(run_dir, partial_tail=False)
    data = load_run(run_dir, now=T0 + 160, max_points=20)
    assert len(data.steps) <= 21
    assert data.steps[-1].step == 100 and data.steps[-1].incarnation == 2


def test_report_of_a_finished_run_and_the_cli(tmp_path):
    """A SUCCEEDED run renders via `python -m orchestrator.report RUN_DIR`."""
    run_dir = tmp_path / "run"
    now = write_run(run_dir, partial_tail=False)
    with open(run_dir / "timeline.jsonl", "a") as fh:
        fh.write(json.dumps({"seq": 16, "state": "SUCCEEDED", "prev": "RUNNING", "at": now,
                             "prev_duration_s": 15.0, "reason": "done", "incarnation": 2,
                             "slices": ["s0", "s2"], "hosts": 4, "step": 100}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.report", str(run_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    page = (run_dir / "report.html").read_text()
    assert "SUCCEEDED" in page and "still running" not in page
    assert (run_dir / "report.png").stat().st_size > 10_000


def test_report_on_an_empty_or_missing_dir_names_the_fix(tmp_path):
    """No records or no directory: an error that says what to do, exit code 2 from the CLI."""
    with pytest.raises(OrchestratorError, match="wait for the first step"):
        build_report(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.report", str(tmp_path / "nope")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_a_slice_swap_is_marked_as_a_replacement(tmp_path):
    """Same slice count, other slice: marked 'replaced', not shrink/grow."""
    from tests.metrics.synthetic import transition

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [transition(0, "RUNNING", None, T0, slices=["a"]),
            transition(1, "PLANNING", "RUNNING", T0 + 5, slices=["a"],
                       reason="re-forming after spot_preemption: x"),
            transition(2, "FORMING", "PLANNING", T0 + 6, inc=1, slices=["b"]),
            transition(3, "RUNNING", "FORMING", T0 + 9, inc=1, slices=["b"])]
    (run_dir / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = [m.label for m in markers(load_run(run_dir, now=T0 + 10))]
    assert labels == ["re-form (spot_preemption)", "replaced a by b"]


def test_the_marks_table_numbers_every_mark_as_the_figure_does(tmp_path):
    """The HTML lists each mark under the number the state strip shows for it."""
    run_dir = tmp_path / "run"
    now = write_run(run_dir, partial_tail=False)
    page = build_report(run_dir, clock=lambda: now).html.read_text()
    labels = [m.label for m in markers(load_run(run_dir, now=now))]
    assert "<th>#</th><th>t (s)</th><th>what</th>" in page
    for n, label in enumerate(labels, start=1):
        assert re.search(rf"<tr><td>{n}</td><td>[0-9.,]+</td><td>{re.escape(html.escape(label))}"
                         r"</td></tr>", page), (n, label)


def test_the_report_shows_the_eval_curve_and_table(tmp_path):
    """A run with eval records: the summary names the newest eval loss, an Eval table lists
    each eval with the task's metrics; a run without says how to get one."""
    run_dir = tmp_path / "run"
    now = write_run(run_dir, partial_tail=False)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        for step, loss in ((50, 4.5), (100, 4.0)):
            rec = EvalRecord(step=step, loss=loss, wall_time=T0 + 20 + step / 2, tokens=2048,
                             seconds=0.5, metrics={"accuracy": step / 200})
            fh.write(json.dumps(rec.to_dict()) + "\n")
    page = build_report(run_dir, clock=lambda: now).html.read_text()
    assert "<td>eval loss (last eval)</td><td>4.0000 at step 100, perplexity 54.6</td>" in page
    assert "<h2>Eval</h2>" in page and "<th>accuracy</th>" in page
    assert "<tr><td>50</td><td>eval</td><td>4.5000</td><td>90.02</td><td>2,048</td>" in page
    assert "<td>0.5</td></tr>" in page  # the accuracy at step 100
    empty = tmp_path / "plain"
    now = write_run(empty, partial_tail=False)
    page = build_report(empty, clock=lambda: now).html.read_text()
    assert "no eval records (eval.every &gt; 0 evaluates the held-out split)" in page
